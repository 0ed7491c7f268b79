"""The Triton executor of page selections against the references: on a GPU where there is
one, else in Triton's interpreter on CPU (small shapes: the interpreter runs each program in
NumPy). float64 is exact up to summation order; float32 and bfloat16 are held to their own
rounding error."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnlab.ops.attention.page_step import (
    attend_best_pages,
    attend_best_pages_reference,
    step_example,
)
from attnlab.ops.attention.pages import paged_attention, paged_attention_naive
from attnlab.ops.sparse_attention import executors
from attnlab.ops.sparse_attention.executors import executor_for
from attnlab.ops.sparse_attention.pages import (
    attend_pages_naive,
    attend_pages_triton,
    selection_example,
)
from attnlab.utils.testing import assert_close
from tests.helpers import triton_on_this_machine

pytestmark = pytest.mark.skipif(not triton_on_this_machine(), reason="triton is not installed")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _on_device(example_inputs: dict, dtype: torch.dtype) -> dict:
    """The example's tensors on DEVICE, its floating ones in ``dtype``; the selection too."""
    moved = {}
    for name, x in example_inputs.items():
        if isinstance(x, torch.Tensor):
            x = x.to(DEVICE, dtype if x.is_floating_point() else x.dtype)
        moved[name] = x
    s = moved["selection"]
    moved["selection"] = dataclasses.replace(
        s, pages=s.pages.to(DEVICE), limit=s.limit.to(DEVICE),
        rank_to_pos=None if s.rank_to_pos is None else s.rank_to_pos.to(DEVICE))
    return moved


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("padded", "causal", "t_q"), [
    (False, True, 21), (True, True, 5), (True, False, 5), (True, True, 1)])
def test_the_kernel_reads_exactly_the_selected_keys(dtype, padded, causal, t_q):
    """Rows with unused slots, a hole and left padding, decoding rows; against the dense mask
    of the same keys in float64."""
    example = selection_example(torch.Generator().manual_seed(3), padded=padded, causal=causal,
                                t_q=t_q)
    inputs = _on_device(example.inputs, dtype)
    out = attend_pages_triton(inputs["q"], inputs["k"], inputs["v"], inputs["selection"],
                              scale=0.4)
    wide = _on_device(example.inputs, torch.float64)
    ref = attend_pages_naive(wide["q"], wide["k"], wide["v"], wide["selection"], scale=0.4)
    assert out.dtype == dtype and out.shape == ref.shape
    assert_close(f"triton {dtype}", ref.cpu(), out.double().cpu(), TOLERANCE[dtype])


def test_a_row_that_reads_no_key_outputs_zero():
    example = selection_example(torch.Generator().manual_seed(0), t_q=1, t_k=1)
    inputs = _on_device(example.inputs, torch.float64)
    inputs["selection"].pages.fill_(-1)
    out = attend_pages_triton(inputs["q"], inputs["k"], inputs["v"], inputs["selection"],
                              scale=0.4)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("scorer", ["quest", "mean"])
def test_paged_attention_through_triton_equals_the_loop_reference(scorer):
    """Decoding rows (the last 3 of 23 keys) of a left-padded batch: the selection in
    PyTorch ops, the attention in the kernel."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 3, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 23, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(2, 23, dtype=torch.bool)
    mask[0, :4] = False
    kw = dict(scale=0.35, budget=12, page=3, scorer=scorer, key_padding_mask=mask)
    ref = paged_attention_naive(q, k, v, **kw)
    on = [x.to(DEVICE) for x in (q, k, v)]
    out = paged_attention(*on, **{**kw, "key_padding_mask": mask.to(DEVICE)},
                          executor="triton")
    assert_close("paged triton", ref, out.cpu(), 1e-12)


def test_triton_is_refused_where_it_cannot_run_and_auto_never_picks_it_on_cpu(monkeypatch):
    q = torch.randn(1, 4, 1, 8)
    k = v = torch.randn(1, 2, 9, 8)
    assert executor_for("auto", q, k, v, triton_fits=True) in ("native", "torch")
    with pytest.raises(ValueError, match="has no 'triton' executor; use 'torch' or 'auto'"):
        executor_for("triton", q, k, v)
    with pytest.raises(ValueError, match="takes no score bias"):
        executor_for("triton", q, k, v, biased=True, triton_fits=True)
    with pytest.raises(ValueError, match="computes no gradients"):
        executor_for("triton", q.requires_grad_(), k, v, triton_fits=True)
    q.requires_grad_(False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if DEVICE.type == "cpu":
        with pytest.raises(ValueError, match="runs on CUDA, not on cpu .*TRITON_INTERPRET=1"):
            executor_for("triton", q, k, v, triton_fits=True)
    monkeypatch.setattr(executors, "_triton_installed", lambda: False)
    with pytest.raises(ValueError, match=r"needs triton \(pip install 'attnlab\[triton\]'\)"):
        executor_for("triton", q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), triton_fits=True)


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("scorer", "causal", "padded", "t_q"), [
    ("quest", True, True, 4), ("mean", False, True, 4), ("quest", True, False, 1),
    ("mean", True, False, 21)])
def test_the_step_kernel_selects_and_attends_as_the_reference(monkeypatch, split, dtype,
                                                              scorer, causal, padded, t_q):
    """One kernel scores the pages from their features, keeps the group's best beside the
    sinks and local pages, and attends (``attend_best_pages`` through ``triton``), against
    the same steps in PyTorch ops; bfloat16 against the float64 reference of the same
    rounded inputs. ``split``: the pages are scored 2 per program, chosen by a second kernel
    and attended through the block-table kernel."""
    from attnlab.ops.sparse_attention import triton_pages, triton_select

    monkeypatch.setattr(triton_pages, "SPLIT_MIN_PAGES", 0 if split else 10**9)
    monkeypatch.setattr(triton_select, "CHUNK_PAGES", 2)
    example = step_example(torch.Generator().manual_seed(2), scorer=scorer, causal=causal,
                           padded=padded, t_q=t_q)
    inputs = {name: x.to(DEVICE) if isinstance(x, torch.Tensor) else x
              for name, x in example.inputs.items()}
    low = {**inputs, **{name: inputs[name].to(dtype) for name in ("q", "k", "v")}}
    out = attend_best_pages(**low, executor="triton")
    wide = {**low, **{name: low[name].double() for name in ("q", "k", "v")}}
    ref = attend_best_pages_reference(**wide)
    assert out.dtype == dtype
    assert_close(f"triton step {dtype}", ref.cpu(), out.double().cpu(), TOLERANCE[dtype])
