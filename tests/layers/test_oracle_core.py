"""The ``oracle`` core (exact top-k keys by true score): decoding, padding, positions, config."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig
from attnlab.layers.oracle import OracleOptions
from tests.layers.test_sea_core import F64, assert_padded_decoding_equals_full_pass, make_ctx


def make_layer(causal=True, positions="rope", core="oracle", **options):
    spec = {"name": core, **options} if core == "oracle" else core
    cfg = AttentionConfig(n_heads=4, d_head=8, positions=positions,
                          projections={"name": "dense", "n_kv_heads": 2},
                          core={"k": 3, **spec} if core == "oracle" else spec)
    torch.manual_seed(0)
    return Attention(make_ctx(causal), cfg).double().eval()


def test_the_default_group_is_kv():
    """Keys per KV head per row, shared by the group's query heads (H=4 over Hk=2 here)."""
    assert OracleOptions().group == "kv"
    assert "group='kv'" in repr(make_layer())


@pytest.mark.parametrize("group", ["kv", "head", "heads"])
def test_cached_decoding_equals_full_pass_with_left_padding(group):
    assert_padded_decoding_equals_full_pass(make_layer(group=group))


def test_cached_decoding_equals_full_pass_with_pages():
    assert_padded_decoding_equals_full_pass(make_layer(k=4, page=2))


def test_the_future_does_not_change_the_past():
    layer = make_layer()
    x = torch.randn(1, 30, 32, dtype=F64)
    changed = x.clone()
    changed[:, 20:] += 1.0
    torch.testing.assert_close(layer(changed).hidden[:, :20], layer(x).hidden[:, :20],
                               rtol=0, atol=0)


@pytest.mark.parametrize("group", ["kv", "head"])
@pytest.mark.parametrize(("causal", "positions", "dense_core"),
                         [(True, "rope", "sdpa"), (False, "rope", "sdpa"), (True, "xl", "eager")])
def test_a_budget_covering_every_key_is_dense_attention(causal, positions, dense_core, group):
    layer = make_layer(causal, positions, k=64, group=group)
    dense = make_layer(causal, positions, core=dense_core)
    dense.load_state_dict(layer.state_dict())
    x = torch.randn(2, 30, 32, dtype=F64)
    torch.testing.assert_close(layer(x).hidden, dense(x).hidden, rtol=0, atol=1e-12)


@pytest.mark.parametrize("group", ["kv", "head", "heads"])
def test_a_small_budget_changes_the_output(group):
    x = torch.randn(2, 30, 32, dtype=F64)
    small, full = make_layer(k=2, group=group), make_layer(k=64, group=group)
    assert (small(x).hidden - full(x).hidden).abs().max() > 1e-3


def test_groups_differ():
    """Same weights, same budget: the three selections give three different outputs."""
    x = torch.randn(2, 30, 32, dtype=F64)
    outs = [make_layer(group=group)(x).hidden for group in ("kv", "head", "heads")]
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        assert (outs[a] - outs[b]).abs().max() > 1e-6


@pytest.mark.parametrize(("options", "match"), [
    ({"k": 0}, "k must be >= 1"), ({"group": "row"}, "group must be one of"),
    ({"k": 3, "page": 2}, "k 3 is not a whole number of pages of 2"),
    ({"k": 4, "page": 2, "group": "head"}, "page 2 needs group 'kv'"),
])
def test_bad_options_are_rejected(options, match):
    with pytest.raises(ConfigError, match=match):
        make_layer(**options)
