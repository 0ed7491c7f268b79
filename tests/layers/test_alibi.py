"""ALiBi positions: the paper's slopes and a bias that is -slope * distance at true positions."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.layers.positions import alibi_slopes
from attnlab.ops.attention import softmax_attention


@pytest.mark.parametrize(("n", "expected"), [
    (8, [2.0 ** -i for i in range(1, 9)]),
    (2, [2.0 ** -4, 2.0 ** -8]),
    (6, [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]),  # 4, then 8's odd
])
def test_slopes_follow_the_paper(n, expected):
    torch.testing.assert_close(alibi_slopes(n), torch.tensor(expected, dtype=torch.float64))


def make_layer(causal=True, projections="dense"):
    ctx = LayerContext(d_model=32, n_heads=4, causal=causal, max_seq_len=64)
    cfg = AttentionConfig(n_heads=4, positions="alibi", projections=projections, core="eager")
    torch.manual_seed(0)
    return Attention(ctx, cfg).double().eval()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_the_layer_equals_scores_minus_slope_times_distance(causal):
    layer = make_layer(causal)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    p = layer.projections.project(x)
    distance = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).double()
    if not causal:
        distance = distance.abs()
    bias = -alibi_slopes(4)[:, None, None] * distance  # [H, T, T]
    o = softmax_attention(p.q, p.k, p.v, scale=layer.projections.score_scale, causal=causal,
                          score_bias=bias)
    expected, _ = layer.projections.output(o, p)
    torch.testing.assert_close(layer(x).hidden, expected, rtol=0, atol=1e-12)


def test_decoding_uses_true_distances_after_a_cache_offset():
    layer = make_layer()
    bias = layer.positions.score_bias(torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 5, 8),
                                      torch.arange(3, 5), torch.arange(5), 0.3, 1.0).dense()
    # query 0 sits at position 3: distances 3, 2, 1, 0 and (masked) -1
    torch.testing.assert_close(bias[0, 0, 0], -0.25 * torch.tensor([3.0, 2, 1, 0, -1]))


def test_cores_without_a_bias_are_refused_with_alternatives():
    with pytest.raises(ConfigError, match="positions 'alibi' adds a score bias.*cores that can"):
        AttentionConfig(positions="alibi", core="performer")
    with pytest.raises(ConfigError, match="exponent must be > 0"):
        AttentionConfig(positions={"name": "alibi", "exponent": 0})
