"""Oracle top-k attention: blocked fast path vs the one-matrix reference, by hand."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention import oracle as oracle_module
from attnlab.ops.attention import softmax_attention
from attnlab.ops.attention.oracle import oracle_attention, oracle_attention_naive
from attnlab.utils.testing import assert_close

F64 = torch.float64


def _qkv(b=2, h=4, hk=2, t_q=37, t_k=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t_q, 8, generator=gen, dtype=F64)
    k, v = (torch.randn(b, hk, t_k, 8, generator=gen, dtype=F64) for _ in range(2))
    return q, k, v


def _mask():
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[0, 10:14] = False  # a hole inside the sequence
    mask[1, :6] = False  # left padding
    return mask


@pytest.mark.parametrize("group", ["head", "heads"])
@pytest.mark.parametrize("budget", [1, 5, 40])
@pytest.mark.parametrize(("causal", "padded", "t_q"),
                         [(True, False, 37), (True, True, 37), (True, True, 3),
                          (False, True, 37)])
def test_blocks_match_the_reference(monkeypatch, group, budget, causal, padded, t_q):
    monkeypatch.setattr(oracle_module, "QUERY_BLOCK", 8)  # several blocks
    q, k, v = _qkv(t_q=t_q)
    bias = torch.randn(1, 4, t_q, 37, dtype=F64)
    kw = dict(scale=0.3, budget=budget, group=group, causal=causal,
              key_padding_mask=_mask() if padded else None, score_bias=bias)
    assert_close("oracle", oracle_attention_naive(q, k, v, **kw), oracle_attention(q, k, v, **kw),
                 1e-13)


def test_a_budget_covering_every_key_is_dense_attention():
    q, k, v = _qkv()
    mask = _mask()
    dense = softmax_attention(q, k, v, scale=0.3, causal=True, key_padding_mask=mask)
    oracle = oracle_attention(q, k, v, scale=0.3, budget=37, group="head", key_padding_mask=mask)
    valid = mask[:, None, :, None].expand_as(dense)  # rows of real queries
    torch.testing.assert_close(oracle[valid], dense[valid], rtol=0, atol=1e-13)


def test_each_head_keeps_its_top_scores():
    """Keys with scores 0..5 (one-hot values): budget 2 per head keeps the two largest."""
    t = 6
    k = torch.arange(t, dtype=F64)[None, None, :, None]  # score of key j = j * q
    q = torch.ones(1, 1, t, 1, dtype=F64)
    v = torch.eye(t, dtype=F64)[None, None]
    out = oracle_attention(q, k, v, scale=1.0, budget=2, group="head", causal=False)
    assert (out[0, 0] > 0).sum(-1).tolist() == [2] * t
    assert out[0, 0, 0].nonzero().flatten().tolist() == [4, 5]
    causal = oracle_attention(q, k, v, scale=1.0, budget=2, group="head")
    assert causal[0, 0, 3].nonzero().flatten().tolist() == [2, 3]
    assert causal[0, 0, 0].nonzero().flatten().tolist() == [0]


def test_grouped_heads_share_the_budget():
    """Ranked jointly, H * k = 4 cells per row go to the highest scores of either head: the
    sharp head (scores 0, 1, 2, 30) takes three, the flat one (0, .01, .02, .3) one."""
    k = torch.tensor([[0.0], [1.0], [2.0], [30.0]], dtype=F64)[None, None].expand(1, 2, 4, 1)
    q = torch.tensor([1.0, 0.01], dtype=F64).view(1, 2, 1, 1).expand(1, 2, 4, 1).clone()
    v = torch.eye(4, dtype=F64)[None, None].expand(1, 2, 4, 4)
    out = oracle_attention(q, k, v, scale=1.0, budget=2, group="heads", causal=False)
    kept = (out[0, :, 0] > 0).sum(-1).tolist()
    assert kept == [3, 1]


def test_future_keys_do_not_change_the_past():
    q, k, v = _qkv()
    out = oracle_attention(q, k, v, scale=0.3, budget=4)
    k2, v2 = k.clone(), v.clone()
    k2[..., 20:, :] += 3.0
    v2[..., 20:, :] -= 2.0
    changed = oracle_attention(q, k2, v2, scale=0.3, budget=4)
    torch.testing.assert_close(changed[..., :20, :], out[..., :20, :], rtol=0, atol=0)


def test_bad_options_are_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="k must be >= 1"):
        oracle_attention(q, k, v, scale=0.3, budget=0)
    with pytest.raises(ValueError, match="group must be one of"):
        oracle_attention_naive(q, k, v, scale=0.3, budget=3, group="row")
