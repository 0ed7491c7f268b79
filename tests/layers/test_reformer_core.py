"""The ``reformer`` attention core: shared QK, decoding state, causality, padding, rotations."""

from __future__ import annotations

import pytest
import torch

import attnlab.layers.reformer  # noqa: F401  (registers the core)
from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.layers.reformer import ReformerCore, ReformerOptions, ReformerState
from attnlab.ops.lsh_attention import lsh_attention, lsh_attention_naive

F64 = torch.float64


def make_ctx(causal=True):
    return LayerContext(d_model=32, n_heads=4, d_head=8, causal=causal, max_seq_len=64,
                        layer_idx=0, n_layers=2, init_scale=1.0)


def make_layer(causal=True, n_kv_heads=None, **options):
    core = {"name": "reformer", "bucket_size": 4, "n_buckets": 4, **options}
    cfg = AttentionConfig(n_heads=4, d_head=8, positions="rope", core=core,
                          projections={"name": "dense", "n_kv_heads": n_kv_heads})
    return Attention(make_ctx(causal), cfg).double().eval()


def make_core(causal=True, **options):
    options = {"bucket_size": 4, "n_buckets": 4, **options}
    return ReformerCore(make_ctx(causal), ReformerOptions(**options)).double()


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_cached_decoding_equals_full_pass(n_kv_heads):
    layer = make_layer(n_kv_heads=n_kv_heads)
    x = torch.randn(2, 30, 32, dtype=F64)  # ~7 positions per bucket: several chunks each
    full = layer(x).hidden
    out = layer(x[:, :11], use_cache=True)
    pieces, cache = [out.hidden], out.cache
    for start, stop in [(11, 12), (12, 15), *((t, t + 1) for t in range(15, 30))]:
        out = layer(x[:, start:stop], cache=cache, use_cache=True)
        pieces.append(out.hidden)
        cache = out.cache
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-10)
    assert isinstance(cache.core_state, ReformerState)
    assert cache.core_state.queries.shape == (2, 4, 30, 8)


def test_causality_future_tokens_do_not_change_the_past():
    layer = make_layer()
    x = torch.randn(2, 24, 32, dtype=F64)
    y = x.clone()
    y[:, 10:] = 3 * torch.randn(2, 14, 32, dtype=F64)
    a, b = layer(x).hidden, layer(y).hidden
    assert torch.equal(a[:, :10], b[:, :10])
    assert (a[:, 10:] - b[:, 10:]).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_padded_tokens_do_not_influence_real_tokens(causal):
    layer = make_layer(causal=causal)
    x = torch.randn(2, 20, 32, dtype=F64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, 15:] = False
    mask[1, [0, 7, 8]] = False
    y = x.clone()
    y[~mask] = 3 * torch.randn(int((~mask).sum()), 32, dtype=F64)
    a = layer(x, key_padding_mask=mask).hidden
    b = layer(y, key_padding_mask=mask).hidden
    assert torch.equal(a[mask], b[mask])
    c = layer(y).hidden  # without the mask the padding does leak in
    assert (c[mask] - a[mask]).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [True, False])
def test_core_is_shared_qk_lsh_attention(causal):
    core = make_core(causal).eval()
    q = torch.randn(2, 4, 21, 8, dtype=F64)
    v = torch.randn(2, 2, 21, 6, dtype=F64)
    mask = torch.rand(2, 21) > 0.2
    out = core(q, torch.randn(2, 2, 21, 8, dtype=F64), v, scale=0.4, key_padding_mask=mask).out
    # the given keys are ignored: the normalised queries are the keys
    assert torch.equal(out, core(q, torch.zeros(2, 2, 21, 8, dtype=F64), v, scale=0.4,
                                 key_padding_mask=mask).out)
    kw = dict(n_hashes=2, bucket_size=4, causal=causal, generator_or_rotations=core.rotations,
              key_padding_mask=mask, scale=0.4)
    torch.testing.assert_close(out, lsh_attention(q, q, v, **kw), rtol=0, atol=0)
    torch.testing.assert_close(out, lsh_attention_naive(q, q, v, **kw), rtol=1e-10, atol=1e-10)


def test_rotations_redrawn_per_training_forward_fixed_in_eval():
    core = make_core()
    stored = core.rotations.clone()
    q, v = torch.randn(1, 4, 24, 8, dtype=F64), torch.randn(1, 4, 24, 8, dtype=F64)
    core.eval()
    evals = [core(q, q, v, scale=0.5).out for _ in range(2)]
    assert torch.equal(evals[0], evals[1])
    core.train()
    trains = [core(q, q, v, scale=0.5).out for _ in range(2)]
    assert not torch.equal(trains[0], trains[1]) and not torch.equal(trains[0], evals[0])
    assert torch.equal(core.rotations, stored)  # the eval rotations are untouched
    fixed = make_core(redraw_rotations=False)
    fixed.load_state_dict(core.state_dict())
    assert torch.equal(fixed.train()(q, q, v, scale=0.5).out, evals[0])


def test_state_dict_restores_the_rotations():
    core = make_core().eval()
    torch.manual_seed(7)
    other = make_core().eval()
    assert not torch.equal(other.rotations, core.rotations)
    other.load_state_dict(core.state_dict())
    q, v = torch.randn(1, 4, 16, 8, dtype=F64), torch.randn(1, 4, 16, 8, dtype=F64)
    assert torch.equal(other(q, q, v, scale=0.5).out, core(q, q, v, scale=0.5).out)


def test_cache_without_matching_state_is_rejected():
    layer = make_layer()
    x = torch.randn(1, 10, 32, dtype=F64)
    cache = layer(x[:, :8], use_cache=True).cache
    with pytest.raises(RuntimeError, match="state of 8 positions"):
        layer(x[:, 8:], cache=cache.trimmed(5))
    layer.train()
    assert layer(x[:, :8], use_cache=True).cache.core_state is None
    with pytest.raises(RuntimeError, match="8 cached positions need their queries.*no state"):
        layer(x[:, 8:], cache=layer(x[:, :8], use_cache=True).cache)


def test_default_bucket_count_follows_max_seq_len():
    core = ReformerCore(make_ctx(), ReformerOptions(n_hashes=3, bucket_size=8))
    assert core.rotations.shape == (3, 8, 4)  # 64 / 8 -> 8 buckets, 4 rotation columns
    assert make_core(n_buckets=10).rotations.shape == (2, 8, 5)


def test_score_bias_is_rejected():
    with pytest.raises(ConfigError, match="positions 'xl' adds a score bias.*reformer"):
        AttentionConfig(core="reformer", positions="xl")


@pytest.mark.parametrize(("options", "match"), [
    ({"n_hashes": 0}, "n_hashes must be >= 1"),
    ({"bucket_size": 0}, "bucket_size must be >= 1"),
    ({"n_buckets": 5}, "n_buckets must be even"),
    ({"n_buckets": 0}, "n_buckets must be even"),
])
def test_bad_options_are_rejected(options, match):
    with pytest.raises(ConfigError, match=match):
        AttentionConfig(core={"name": "reformer", **options})
