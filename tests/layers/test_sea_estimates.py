"""Reading SEA's estimated attention out of a model (token importance)."""

from __future__ import annotations

import pytest
import torch

from attnlab.layers.cores import DenseCore, ScoreOptions
from attnlab.layers.sea import record_estimates
from attnlab.ops.attention import softmax_attention
from attnlab.ops.sea import bin_edges
from attnlab.ops.sparse_attention import masked_attention
from attnlab.utils.testing import assert_close
from tests.layers.test_sea_core import make_core, make_ctx, make_layer, qkv

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


def test_what_is_not_a_model_is_a_type_error():
    with pytest.raises(TypeError, match=r"model must be a model \(torch.nn.Module\) holding "
                                        "SEA cores, got torch.Tensor"):
        with record_estimates(torch.zeros(2, 3)):
            pass


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_attended_keys_are_what_the_core_attended(causal):
    """With the output gates open (the sparse attention alone), the core's output is the
    dense attention masked to the recorded ``attended()`` keys."""
    options = {} if causal else {"topk_group": "batch"}
    core = make_core(causal, output="mix", **options)
    with torch.no_grad():
        core.estimator.scalers.weight.zero_()
        core.estimator.scalers.bias.fill_(60.0)
    q, k, v = qkv(t=30)
    with record_estimates(core) as estimates:
        out = core(q, k, v, scale=0.35).out
    attended = estimates[0].attended()
    assert attended.shape == (2, 4, 30, 30) and 0 < int(attended.sum()) < attended.numel()
    assert_close("masked", masked_attention(q, k, v, attended, scale=0.35, row_scale=None),
                 out, 1e-12)
    if causal:
        assert not attended.triu(1).any()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_exact_attention_weights_are_the_dense_cores(causal):
    core = make_core(causal)
    dense = DenseCore(make_ctx(causal), ScoreOptions(), 0.0, softmax_attention).double()
    q, k, v = qkv(t=20)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :4] = False
    kw = dict(scale=0.35, key_padding_mask=mask)
    assert_close("weights", dense.attention_weights(q, k, v, **kw),
                 core.attention_weights(q, k, v, **kw), 1e-13)
