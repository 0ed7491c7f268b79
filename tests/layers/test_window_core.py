"""The ``window`` core (sinks + sliding window): decoding, padding, config."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig
from tests.layers.test_sea_core import F64, assert_padded_decoding_equals_full_pass, make_ctx


def make_layer(causal=True, positions="rope", **options):
    cfg = AttentionConfig(n_heads=4, d_head=8, positions=positions,
                          projections={"name": "dense", "n_kv_heads": 2},
                          core={"name": "window", "sinks": 2, "window": 5, **options})
    torch.manual_seed(0)
    return Attention(make_ctx(causal), cfg).double().eval()


def test_cached_decoding_equals_full_pass_with_left_padding():
    assert_padded_decoding_equals_full_pass(make_layer())


def test_a_long_window_is_dense_attention():
    layer = make_layer(window=64)
    x = torch.randn(2, 30, 32, dtype=F64)
    dense = make_layer(window=64)
    dense.core = Attention(make_ctx(), AttentionConfig(n_heads=4, d_head=8, positions="rope",
                                                       core="eager")).core
    torch.testing.assert_close(layer(x).hidden, dense(x).hidden, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("options", "match"), [
    ({"window": 0}, "window must be"), ({"sinks": -1}, "sinks must be"),
])
def test_bad_options_are_rejected(options, match):
    with pytest.raises(ConfigError, match=match):
        make_layer(**options)


def test_bidirectional_and_score_bias_are_refused():
    with pytest.raises(ValueError, match="causal"):
        make_layer(causal=False)
    layer = make_layer()
    q = torch.randn(1, 4, 5, 8, dtype=F64)
    with pytest.raises(ValueError, match="score bias"):
        layer.core(q, q, q, scale=0.3, score_bias=torch.zeros(1, 1, 5, 5, dtype=F64))
