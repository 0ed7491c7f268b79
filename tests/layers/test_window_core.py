"""The ``window`` core (sinks + sliding window): decoding, padding, config."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig
from tests.layers.test_sea_core import (
    BOUNDS,
    F64,
    assert_padded_decoding_equals_full_pass,
    decode_in_pieces,
    make_ctx,
)


def make_layer(causal=True, positions="rope", **options):
    cfg = AttentionConfig(n_heads=4, d_head=8, positions=positions,
                          projections={"name": "dense", "n_kv_heads": 2},
                          core={"name": "window", "sinks": 2, "window": 5, **options})
    torch.manual_seed(0)
    return Attention(make_ctx(causal), cfg).double().eval()


def test_cached_decoding_equals_full_pass_with_left_padding():
    assert_padded_decoding_equals_full_pass(make_layer())


@pytest.mark.parametrize("positions", ["rope", "none"])
def test_the_decoding_cache_keeps_only_the_sinks_and_the_window(positions):
    """Token by token over 30 tokens (sinks 2, window 5), with a hole in one row: the cache
    holds at most the sinks, the hole and the last 4 keys, at their true positions, and
    decoding still equals the full pass."""
    layer = make_layer(positions=positions)
    x = torch.randn(2, 30, 32, dtype=F64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, 25:27] = False
    with torch.no_grad():
        full = layer(x, key_padding_mask=mask).hidden
        steps, cache = decode_in_pieces(layer, x, BOUNDS, key_padding_mask=mask)
    torch.testing.assert_close(steps[mask], full[mask], rtol=0, atol=1e-12)
    assert cache.positions.tolist() == [0, 1, *range(24, 30)]
    assert cache.length == 8 and cache.next_position == 30
    assert cache.key_mask.tolist()[1] == [True, True, True, False, False, True, True, True]


def test_a_cache_from_the_full_length_mask_or_the_new_tokens_mask_is_the_same():
    """``key_padding_mask`` may cover every token seen (Hugging Face style) even after the
    cache dropped some: the layer picks the kept columns."""
    layer = make_layer()
    x = torch.randn(2, 20, 32, dtype=F64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, :3] = False
    with torch.no_grad():
        cache = layer(x[:, :19], key_padding_mask=mask[:, :19], use_cache=True).cache
        covering = layer(x[:, 19:], key_padding_mask=mask, cache=cache).hidden
        current = layer(x[:, 19:], key_padding_mask=mask[:, 19:], cache=cache).hidden
    assert cache.length < 19
    torch.testing.assert_close(covering, current, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\[batch=2, 1\] or \[batch=2, 20\]"):
        layer(x[:, 19:], key_padding_mask=mask[:, :cache.length + 1], cache=cache)


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


def test_bidirectional_is_refused():
    with pytest.raises(ValueError, match="causal"):
        make_layer(causal=False)


def test_a_score_bias_equals_the_dense_reference():
    """XL relative positions through the window core: the bias is evaluated per query
    block and equals the eager core under the same sink + window mask."""
    layer = make_layer(positions="xl")
    x = torch.randn(2, 600, 32, dtype=F64)  # 3 query blocks
    q, k, v = (t.transpose(1, 2) for t in (x.view(2, 600, 4, 8),) * 3)
    bias = layer.positions.score_bias(q, k, torch.arange(600), torch.arange(600), 0.3, 1.0)
    from attnlab.ops.attention.window import window_attention, window_attention_naive

    fast = window_attention(q, k, v, scale=0.3, sinks=2, window=5, score_bias=bias.at)
    slow = window_attention_naive(q, k, v, scale=0.3, sinks=2, window=5,
                                  score_bias=bias.dense())
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
