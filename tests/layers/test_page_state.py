"""Decoding through a page core's state: each step adds its keys to the kept page summaries,
scores pages from the kept features and reads only its pages, and equals the full pass."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import PartSpec
from attnlab.layers import CORES, LayerContext
from attnlab.layers.page_state import PageState
from attnlab.ops.sparse_attention import native
from attnlab.utils.testing import assert_close
from tests.helpers import triton_on_this_machine

F64 = torch.float64
B, H, HK, T, D, PAD = 2, 4, 2, 29, 8, 5
OPTIONS = {"budget": 9, "page": 3}


def core(name: str, executor: str = "auto"):
    built = CORES.build(PartSpec(name, {**OPTIONS, "executor": executor}),
                        ctx=LayerContext(d_model=H * D, n_heads=H, d_head=D), dropout=0.0)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in built.parameters():  # a trained-looking estimator, its softmaxes not
            param.normal_(0.0, 0.3)       # saturated (exact ties of summed masses)
    return built.to(F64).eval()


def inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen, dtype=F64)
    k, v = (torch.randn(B, HK, T, D, generator=gen, dtype=F64) for _ in range(2))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :PAD] = False
    return q, k, v, mask


def decode(layer, q, k, v, mask, first: int, step: int):
    """A prefill of ``first`` tokens, then ``step`` tokens per call, each call handing the
    core the state it returned (``mask`` None: no padding); -> (outputs ``[B, H, T, D]``,
    the calls that used a state)."""
    def upto(stop: int):
        return None if mask is None else mask[:, :stop]

    out = layer(q[..., :first, :], k[..., :first, :], v[..., :first, :], scale=0.4,
                key_padding_mask=upto(first))
    pieces, state, used = [out.out], out.state, 0
    for start in range(first, T, step):
        stop = min(start + step, T)
        used += isinstance(state, PageState) and state.n_tokens == start
        out = layer(q[..., start:stop, :], k[..., :stop, :], v[..., :stop, :], scale=0.4,
                    key_padding_mask=upto(stop), state=state)
        pieces.append(out.out)
        state = out.state
    return torch.cat(pieces, dim=-2), used


@pytest.mark.parametrize("name", ["quest", "block", "sea_pages"])
@pytest.mark.parametrize("autograd", [False, True], ids=["inference", "autograd"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_decoding_from_the_state_equals_the_full_pass(monkeypatch, name, autograd, padded):
    """Without autograd the native kernel reads the pages (where it is built); with it, the
    PyTorch executor does. Without padding the state counts its keys without reading them."""
    calls = []
    real = native.page_attention_native
    monkeypatch.setattr(native, "page_attention_native",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    layer = core(name)
    q, k, v, mask = inputs()
    mask = mask if padded else None
    pad = PAD if padded else 0
    with torch.set_grad_enabled(autograd):
        if autograd:
            q.requires_grad_(True)
        full = layer(q, k, v, scale=0.4, key_padding_mask=mask).out
        out, used = decode(layer, q, k, v, mask, first=7, step=1)
    assert used == T - 7  # every step decoded from the state
    assert bool(calls) == (not autograd and native.available())
    assert_close("decoded", full[..., pad:, :], out[..., pad:, :], 1e-13)
    assert_close("decoded, unpadded row", full[1], out[1], 1e-13)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_steps_of_several_tokens_equal_the_full_pass(padded):
    """Steps of 5 tokens complete up to two pages at once."""
    layer = core("sea_pages")
    q, k, v, mask = inputs(1)
    mask = mask if padded else None
    with torch.no_grad():
        full = layer(q, k, v, scale=0.4, key_padding_mask=mask).out
        out, used = decode(layer, q, k, v, mask, first=4, step=5)
    assert used == 5
    rows = slice(PAD if padded else 0, None)
    assert_close("decoded by 5", full[..., rows, :], out[..., rows, :], 1e-13)


@pytest.mark.skipif(not native.available(), reason="the native kernel is not built")
def test_a_bfloat16_state_keeps_16_bit_features_and_equals_the_full_pass():
    """The features sit beside the cache in the model's dtype (half the memory of float32's),
    and the full pass reads the same rounded features, so decoding still equals it."""
    layer = core("sea_pages").to(torch.bfloat16)
    q, k, v, mask = (x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs(3))
    with torch.no_grad():
        full = layer(q, k, v, scale=0.4, key_padding_mask=mask).out
        out, used = decode(layer, q, k, v, mask, first=7, step=1)
        state = layer(q, k, v, scale=0.4, key_padding_mask=mask).state
    assert used == T - 7 and state.pages.features.dtype == torch.bfloat16
    assert_close("decoded in bfloat16", full[..., PAD:, :].double(),
                 out[..., PAD:, :].double(), 2 * torch.finfo(torch.bfloat16).eps)


@pytest.mark.skipif(not triton_on_this_machine(), reason="triton is not installed")
@pytest.mark.parametrize(("padded", "prior", "split"),
                         [(True, 1.0, False), (False, 1.0, False), (False, 30.0, False),
                          (True, 1.0, True), (False, 30.0, True)],
                         ids=["padded", "unpadded", "strong-recency-prior", "split-padded",
                              "split-strong-recency-prior"])
def test_decoding_through_the_triton_kernel_equals_the_full_pass(monkeypatch, padded, prior,
                                                                 split):
    """``executor: triton`` (the GPU's decoding path; here in Triton's interpreter on CPU
    where there is no GPU): the prefill attends to its selection through one kernel, every
    step selects and attends in the other, and both equal the PyTorch executor's full pass.
    ``prior`` scales the estimator's bias by page distance (with 30 it decides the pages).
    ``split``: the steps select through the split kernels (pages scored 2 per program) and
    attend through the block-table kernel."""
    from attnlab.ops.sparse_attention import triton_pages, triton_select

    monkeypatch.setattr(triton_pages, "SPLIT_MIN_PAGES", 0 if split else 10**9)
    monkeypatch.setattr(triton_select, "CHUNK_PAGES", 2)
    calls = []
    for name in ("attend_pages_kernel", "best_pages_kernel"):
        real = getattr(triton_pages, name)
        monkeypatch.setattr(triton_pages, name, lambda *a, _real=real, _name=name, **kw:
                            calls.append(_name) or _real(*a, **kw))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k, v, mask = (x.to(device) for x in inputs(5))
    mask = mask if padded else None
    layers = [core("sea_pages", executor).to(device) for executor in ("torch", "triton")]
    with torch.no_grad():
        for layer in layers:
            layer.scorer.distance.mul_(prior)
        full = layers[0](q, k, v, scale=0.4, key_padding_mask=mask).out
        out, used = decode(layers[1], q, k, v, mask, first=7, step=1)
    assert used == T - 7
    step = ["best_pages_kernel", "attend_pages_kernel"] if split else ["best_pages_kernel"]
    assert calls == ["attend_pages_kernel"] + step * (T - 7)
    rows = slice(PAD if padded else 0, None)
    assert_close("decoded through triton", full[..., rows, :].cpu(), out[..., rows, :].cpu(),
                 1e-12)


def test_a_state_of_other_keys_is_not_used_and_a_new_one_starts():
    layer = core("quest")
    q, k, v, mask = inputs(2)
    with torch.no_grad():
        stale = layer(q[..., :6, :], k[..., :6, :], v[..., :6, :], scale=0.4).state
        full = layer(q, k, v, scale=0.4).out
        out = layer(q[..., 10:, :], k, v, scale=0.4, state=stale)  # 10 cached, state of 6
    assert out.state is not stale and out.state.n_tokens == T
    assert_close("restarted", full[..., 10:, :], out.out, 1e-13)


def test_a_training_mode_core_carries_no_state():
    layer = core("quest").train()
    q, k, v, _ = inputs()
    assert layer(q, k, v, scale=0.4).state is None


@pytest.mark.parametrize("name", ["quest", "sea_pages"])
def test_bfloat16_features_beside_float32_keys_halve_the_state_and_decode_as_the_full_pass(
        name):
    """``feature_dtype: bfloat16`` keeps a float32 layer's page features in 16 bits; the full
    pass that starts the state reads the same rounded features, so decoding equals it."""
    built = CORES.build(PartSpec(name, {**OPTIONS, "feature_dtype": "bfloat16"}),
                        ctx=LayerContext(d_model=H * D, n_heads=H, d_head=D), dropout=0.0)
    layer = built.float().eval()
    q, k, v, mask = (x.float() if x.is_floating_point() else x for x in inputs(4))
    with torch.no_grad():
        full = layer(q, k, v, scale=0.4, key_padding_mask=mask)
        out, used = decode(layer, q, k, v, mask, first=7, step=1)
        keys_dtype = core(name).float()(q, k, v, scale=0.4, key_padding_mask=mask).state
    assert used == T - 7
    assert full.state.pages.features.dtype == torch.bfloat16
    assert keys_dtype.pages.features.dtype == torch.float32
    assert_close("decoded, bfloat16 features", full.out[..., PAD:, :].double(),
                 out[..., PAD:, :].double(), 1e-6)


def test_an_unknown_feature_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="feature_dtype 'float16' is not valid; valid: keys, "
                                         "bfloat16"):
        CORES.build(PartSpec("quest", {**OPTIONS, "feature_dtype": "float16"}),
                    ctx=LayerContext(d_model=H * D, n_heads=H, d_head=D), dropout=0.0)
