"""The ``performer`` attention core: decoding state, causality, padding, redraws, config."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab.layers.performer  # noqa: F401  (registers the core)
from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.layers.performer import PerformerCore, PerformerCoreState, PerformerOptions
from attnlab.ops.performer import performer_attention_naive

F64 = torch.float64


def make_ctx(causal=True, d_head=8, n_heads=4):
    return LayerContext(d_model=32, n_heads=n_heads, d_head=d_head, causal=causal,
                        max_seq_len=64, layer_idx=0, n_layers=2, init_scale=1.0)


def make_layer(causal=True, n_kv_heads=None, **options):
    cfg = AttentionConfig(n_heads=4, d_head=8, positions="rope",
                          projections={"name": "dense", "n_kv_heads": n_kv_heads},
                          core={"name": "performer", "chunk_size": 4, **options})
    return Attention(make_ctx(causal), cfg).double().eval()


def make_core(causal=True, **options):
    return PerformerCore(make_ctx(causal), PerformerOptions(**options)).double()


def decode(layer, x, prefix):
    """Run ``x [B, T, d]`` as a prefix, then one token at a time; outputs and final cache."""
    out = layer(x[:, :prefix], use_cache=True)
    pieces, cache = [out.hidden], out.cache
    for t in range(prefix, x.shape[1]):
        out = layer(x[:, t : t + 1], cache=cache, use_cache=True)
        pieces.append(out.hidden)
        cache = out.cache
    return torch.cat(pieces, dim=1), cache


@pytest.mark.parametrize("kernel", ["auto", "softmax"])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_cached_decoding_equals_full_pass(kernel, n_kv_heads):
    layer = make_layer(kernel=kernel, n_kv_heads=n_kv_heads)
    x = torch.randn(2, 13, 32, dtype=F64)
    full = layer(x).hidden
    steps, cache = decode(layer, x, prefix=6)  # prefix spans chunks of 4
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-10)
    state = cache.core_state
    assert isinstance(state, PerformerCoreState) and state.n_tokens == 13
    assert state.sums.kv.shape == (2, n_kv_heads or 4, 16, 8)  # m = int(8 ln 8) = 16


def test_stale_state_is_not_used():
    """A trimmed cache or a redrawn projection makes the core recompute from the given keys."""
    layer = make_layer()
    x = torch.randn(1, 12, 32, dtype=F64)
    cache = layer(x[:, :8], use_cache=True).cache
    step = layer(x[:, 8:], cache=cache.trimmed(5)).hidden  # state covers 8 positions, cache 5
    torch.testing.assert_close(step, layer(x[:, 3:]).hidden[:, 5:], rtol=0, atol=1e-10)
    layer.core.redraw_projection()
    step = layer(x[:, 8:], cache=cache).hidden
    torch.testing.assert_close(step, layer(x).hidden[:, 8:], rtol=0, atol=1e-10)


def test_training_mode_returns_no_state():
    layer = make_layer().train()
    out = layer(torch.randn(1, 5, 32, dtype=F64), use_cache=True)
    assert out.cache is not None and out.cache.core_state is None


@pytest.mark.parametrize("kernel", ["relu", "softmax"])
def test_causality_future_tokens_do_not_change_the_past(kernel):
    layer = make_layer(kernel=kernel)
    x = torch.randn(2, 14, 32, dtype=F64)
    y = x.clone()
    y[:, 7:] = 5 * torch.randn(2, 7, 32, dtype=F64)
    a, b = layer(x).hidden, layer(y).hidden
    assert torch.equal(a[:, :7], b[:, :7])
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-3


def test_bidirectional_padded_keys_do_not_influence_real_tokens():
    layer = make_layer(causal=False)
    assert layer.core.kernel == "softmax"  # auto, bidirectional
    x = torch.randn(2, 9, 32, dtype=F64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 6:] = False
    mask[1, :2] = False
    y = x.clone()
    y[~mask] = 3 * torch.randn(int((~mask).sum()), 32, dtype=F64)
    a = layer(x, key_padding_mask=mask).hidden
    b = layer(y, key_padding_mask=mask).hidden
    torch.testing.assert_close(a[mask], b[mask], rtol=0, atol=1e-12)
    c = layer(y).hidden  # without the mask the padding does leak in
    assert (c[mask] - a[mask]).abs().max() > 1e-3


@pytest.mark.parametrize("kernel", ["relu", "softmax"])
@pytest.mark.parametrize("causal", [True, False])
def test_core_matches_naive_reference(kernel, causal):
    core = make_core(causal, kernel=kernel, chunk_size=5).eval()
    q = torch.randn(2, 4, 17, 8, dtype=F64)
    k, v = torch.randn(2, 2, 17, 8, dtype=F64), torch.randn(2, 2, 17, 6, dtype=F64)
    mask = torch.rand(2, 17) > 0.3
    out = core(q, k, v, scale=0.3, key_padding_mask=mask).out
    ref = performer_attention_naive(q, k, v, core.projection, kernel=kernel, causal=causal,
                                    scale=0.3, key_padding_mask=mask)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_computes_in_fp32_under_autocast():
    core = PerformerCore(make_ctx(False), PerformerOptions())
    q, k, v = (torch.randn(1, 4, 10, 8) for _ in range(3))
    expected = core(q, k, v, scale=8**-0.5).out
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = core(q, k, v, scale=8**-0.5).out
    assert out.dtype == torch.float32 and torch.equal(out, expected)


def test_redraw_only_in_training_mode_every_n_calls():
    core = make_core(redraw_every=2)
    q = torch.randn(1, 4, 6, 8, dtype=F64)
    draws = [core.projection.clone()]
    core.eval()
    for _ in range(3):
        core(q, q, q, scale=1.0)
    assert torch.equal(core.projection, draws[0]) and int(core.train_calls) == 0
    core.train()
    for _ in range(6):
        core(q, q, q, scale=1.0)
        draws.append(core.projection.clone())
    changed = [not torch.equal(a, b) for a, b in zip(draws, draws[1:], strict=False)]
    assert changed == [False, False, True, False, True, False]  # before calls 3 and 5
    assert int(core.train_calls) == 6 and core.projection_version == 2
    never = make_core()
    before = never.projection.clone()
    never.train()(q, q, q, scale=1.0)
    assert torch.equal(never.projection, before)


def test_state_dict_restores_projection_and_redraw_schedule():
    core = make_core(redraw_every=2).train()
    q = torch.randn(1, 4, 6, 8, dtype=F64)
    for _ in range(3):
        core(q, q, q, scale=1.0)
    torch.manual_seed(123)
    fresh = make_core(redraw_every=2)
    assert not torch.equal(fresh.projection, core.projection)
    fresh.load_state_dict(core.state_dict())
    assert torch.equal(fresh(q, q, q, scale=1.0).out, core(q, q, q, scale=1.0).out)
    assert int(fresh.train_calls) == 4


def test_feature_count_and_kernel_resolution():
    assert make_core(causal=True).kernel == "relu"
    assert make_core(causal=False).kernel == "softmax"
    core = PerformerCore(make_ctx(d_head=64), PerformerOptions())
    assert core.projection.shape == (int(64 * math.log(64)), 64) == (266, 64)  # SEA, nbf=1
    assert make_core(n_features=33).projection.shape == (33, 8)


def test_score_bias_is_rejected():
    with pytest.raises(ConfigError, match="positions 'xl' adds a score bias.*performer"):
        AttentionConfig(core="performer", positions="xl")


@pytest.mark.parametrize(("options", "match"), [
    ({"kernel": "gauss"}, "kernel must be one of"),
    ({"n_features": 0}, "n_features must be >= 1"),
    ({"redraw_every": -1}, "redraw_every must be >= 0"),
    ({"chunk_size": 0}, "chunk_size must be >= 1"),
])
def test_bad_options_are_rejected(options, match):
    with pytest.raises(ConfigError, match=match):
        AttentionConfig(core={"name": "performer", **options})


@pytest.mark.parametrize("causal", [True, False])
def test_attention_weights_are_what_the_core_applies(causal):
    core = PerformerCore(make_ctx(causal), PerformerOptions(n_features=16)).double()
    q, k, v = (torch.randn(2, 4, 12, 8, dtype=torch.float64) for _ in range(3))
    weights = core.attention_weights(q, k, scale=0.3)
    torch.testing.assert_close(weights @ v, core(q, k, v, scale=0.3).out)
