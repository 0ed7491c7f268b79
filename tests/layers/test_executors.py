"""The page cores and the window on every executor: the same output as the reference, and
one place that decides which executor runs (:mod:`attnlab.ops.sparse_attention.executors`)."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.config import PartSpec
from attnlab.layers import CORES, LayerContext
from attnlab.ops.attention.pages import paged_attention_naive
from attnlab.ops.attention.window import window_attention_naive
from attnlab.ops.sparse_attention.executors import COMPILE_MIN_QUERIES, executor_for
from attnlab.utils.testing import assert_close

B, H, HK, D = 2, 6, 2, 16
T = 2 * COMPILE_MIN_QUERIES  # a prefill: flex runs compiled
OPTIONS = {"budget": 48, "page": 16}


def _core(name: str, executor: str, options: dict = OPTIONS):
    ctx = LayerContext(d_model=H * D, n_heads=H, d_head=D)
    built = CORES.build(PartSpec(name, {**options, "executor": executor}), ctx=ctx,
                        dropout=0.0)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in built.parameters():
            param.normal_(0.0, 0.3)
    return built.eval()


def _inputs(dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=gen, dtype=dtype)
    k, v = (torch.randn(B, HK, T, D, generator=gen, dtype=dtype) for _ in range(2))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :7] = False
    return q, k, v, mask


@pytest.mark.parametrize("executor", ["native", "flex", "torch"])
@pytest.mark.parametrize("name", ["quest", "block", "sea_pages"])
def test_every_executor_gives_the_reference(name, executor):
    """float32 (the compiled FlexAttention kernel's dtype on CPU), with left padding."""
    core = _core(name, executor)
    q, k, v, mask = _inputs(torch.float32)
    with torch.no_grad():
        out = core(q, k, v, scale=0.25, key_padding_mask=mask).out
        scorer = core.scorer  # a name, or sea_pages' estimator (then in float64)
        if isinstance(scorer, torch.nn.Module):
            scorer = copy.deepcopy(scorer).double()
        ref = paged_attention_naive(q.double(), k.double(), v.double(), scale=0.25,
                                    budget=48, page=16, scorer=scorer, key_padding_mask=mask)
    real = mask[:, None, :, None].expand_as(out)  # padded queries' outputs are undefined
    assert_close(executor, ref[real], out.double()[real], 1e-5)


@pytest.mark.parametrize("executor", ["native", "flex", "torch"])
@pytest.mark.parametrize("t_q", [T, 3], ids=["prefill", "decoding"])
def test_the_window_on_every_executor_gives_the_reference(executor, t_q):
    """float32, left padding; a prefill (flex compiled) and decoding rows (flex eager)."""
    core = _core("window", executor, {"sinks": 4, "window": 24})
    q, k, v, mask = _inputs(torch.float32)
    with torch.no_grad():
        out = core(q[..., -t_q:, :], k, v, scale=0.25, key_padding_mask=mask).out
    ref = window_attention_naive(q[..., -t_q:, :].double(), k.double(), v.double(), scale=0.25,
                                 sinks=4, window=24, key_padding_mask=mask)
    real = mask[:, None, -t_q:, None].expand_as(out)
    assert_close(executor, ref[real], out.double()[real], 1e-5)


def test_auto_picks_native_on_cpu_inference_and_torch_for_gradients():
    q, k, v, _ = _inputs(torch.float32)
    assert executor_for("auto", q, k, v, biased=False) == "native"
    assert executor_for("auto", q, k, v, biased=True) == "torch"
    q.requires_grad_()
    assert executor_for("auto", q, k, v, biased=False) == "torch"
    assert executor_for("native", q, k, v, biased=False) == "torch"  # same result
    assert executor_for("flex", q, k, v, biased=False) == "flex"
    q.requires_grad_(False)
    assert executor_for("auto", q, k, v, biased=False, native_fits=False) == "torch"


def test_an_executor_that_cannot_run_is_refused_naming_what_would():
    q, k, v, _ = (x.to("meta") for x in _inputs(torch.float32))
    with pytest.raises(ValueError, match="runs on the CPU, not on meta; use 'flex'"):
        executor_for("native", q, k, v, biased=False)
    assert executor_for("auto", q, k, v, biased=False) == "flex"  # a prefill off the CPU
    assert executor_for("auto", q[..., :1, :], k, v, biased=False) == "torch"
    with pytest.raises(ValueError, match="'flex' takes no score bias"):
        executor_for("flex", q, k, v, biased=True)


def test_an_unknown_executor_is_refused_at_config_time():
    with pytest.raises(ValueError, match="unknown executor 'cuda'; choose one of auto, "
                                         "native, flex, triton, torch"):
        _core("quest", "cuda")


def test_a_selector_without_a_flex_path_refuses_flex_and_never_gets_it():
    q, k, v, _ = (x.to("meta") for x in _inputs(torch.float32))
    with pytest.raises(ValueError, match="has no 'flex' executor"):
        executor_for("flex", q, k, v, flex_fits=False)
    with pytest.raises(ValueError, match="not on meta; use 'torch' or 'auto'"):
        executor_for("native", q, k, v, flex_fits=False)
    assert executor_for("auto", q, k, v, flex_fits=False) == "torch"


def test_an_executor_a_selector_lacks_is_refused_at_config_time_naming_its_choices():
    with pytest.raises(ValueError, match="has no 'triton' executor; choose one of auto, "
                                         "native, flex, torch"):
        _core("window", "triton", {"sinks": 4, "window": 24})
    assert _core("quest", "triton").options.executor == "triton"
