"""Reading SEA's estimated attention out of a model (token importance)."""

from __future__ import annotations

import pytest
import torch

from attnlab.layers.sea import record_estimates
from attnlab.ops.sea import bin_edges
from tests.layers.test_sea_core import make_layer

F64 = torch.float64


def _loop_dense(est, b, h, t):
    """The bin -> keys spreading of one row, by hand."""
    row = torch.zeros(est.n_keys, dtype=F64)
    length = int(est.lengths[b, t])
    edges = bin_edges(est.lengths[b, t], est.compressed.shape[-1]).tolist()
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        for rank in range(lo, min(hi, length)):
            pos = rank if est.rank_to_pos is None else int(est.rank_to_pos[b, rank])
            row[pos] = est.compressed[b, h, t, i] / (hi - lo)
    return row


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_estimates_are_recorded_per_call_and_spread_over_the_keys(causal):
    layer = make_layer(causal)  # 4 heads, predictor_length 8
    x = torch.randn(2, 20, 32, dtype=F64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :3] = False  # padding: ranks differ from positions
    with record_estimates(layer) as estimates:
        layer(x, key_padding_mask=mask)
        layer(x[:, :7])
    assert len(estimates) == 2 and layer.core.estimate_sink is None
    est = estimates[0]
    assert est.compressed.shape == (2, 4, 20, 8) and est.n_keys == 20
    dense = est.dense()
    assert dense.shape == (2, 4, 20, 20)
    for b, h, t in [(0, 0, 0), (0, 3, 19), (1, 2, 5), (1, 1, 12)]:
        torch.testing.assert_close(dense[b, h, t], _loop_dense(est, b, h, t))
    real = mask[:, None, :, None].expand(2, 4, 20, 1).squeeze(-1)
    sums = dense.sum(-1)
    torch.testing.assert_close(sums[real], torch.ones_like(sums[real]))
    assert (dense[1, :, :, :3] == 0).all()  # padded keys get nothing
    if causal:
        assert (dense[0].triu(1) == 0).all()  # no row expects a later key
    importance = est.key_importance()
    assert importance.shape == (2, 20)
    torch.testing.assert_close(importance.sum(-1), sums.mean(1).sum(-1))


def test_a_model_without_sea_is_refused():
    layer = make_layer()
    layer.core = torch.nn.Identity()
    with pytest.raises(ValueError, match="no sea attention core"):
        with record_estimates(layer):
            pass
