"""Oracle top-k attention: the ``kv`` selection against every subset of keys, what each
grouping keeps, refusals (the blocked fast path against the one-matrix reference:
test_contract)."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnlab.ops.attention import softmax_attention
from attnlab.ops.attention.masks import allowed_keys, expand_kv_heads
from attnlab.ops.attention.oracle import oracle_attention, oracle_attention_naive, oracle_keep

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


@pytest.mark.parametrize("group", ["kv", "head"])
def test_a_budget_covering_every_key_is_dense_attention(group):
    q, k, v = _qkv()
    mask = _mask()
    dense = softmax_attention(q, k, v, scale=0.3, causal=True, key_padding_mask=mask)
    oracle = oracle_attention(q, k, v, scale=0.3, budget=37, group=group, key_padding_mask=mask)
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


def test_raw_scores_across_heads_can_starve_a_head():
    """Head 0's scores are head 1's plus 10: the same attention (softmax ignores the shift),
    yet ``heads`` gives both of a row's H * k = 2 cells to head 0 and leaves head 1 with no
    key (output 0). ``kv`` gives each head of the group the same k keys, the ones head 1
    (and head 0) attends most."""
    k = torch.tensor([[0.0], [1.0], [2.0], [3.0]], dtype=F64)[None, None]
    q = torch.ones(1, 2, 1, 1, dtype=F64)
    v = torch.eye(4, dtype=F64)[None, None]
    bias = torch.tensor([10.0, 0.0], dtype=F64).view(1, 2, 1, 1).expand(1, 2, 1, 4)
    kw = dict(scale=1.0, budget=1, causal=False, score_bias=bias)
    heads = oracle_attention(q, k, v, group="heads", **kw)
    assert heads[0, :, 0].sum(-1).tolist() == [1.0, 0.0]  # head 1 reads nothing
    kv = oracle_attention(q, k, v, group="kv", **kw)
    assert kv[0, :, 0].tolist() == [[0.0, 0.0, 0.0, 1.0]] * 2


def _setup(seed, t_k=7, causal=True):
    """Small random inputs (B=2, H=4, Hk=2; padding; a bias), their full scores and allowed
    keys ``[B, H, Tq, Tk]``, and one-hot values: the op's output is its attention."""
    gen = torch.Generator().manual_seed(seed)
    q = 2.0 * torch.randn(2, 4, t_k, 3, generator=gen, dtype=F64)
    k = torch.randn(2, 2, t_k, 3, generator=gen, dtype=F64)
    bias = torch.randn(1, 4, t_k, t_k, generator=gen, dtype=F64)
    mask = torch.ones(2, t_k, dtype=torch.bool)
    mask[0, 2] = False
    mask[1, :2] = False
    allowed = allowed_keys(t_k, t_k, causal=causal, key_padding_mask=mask, device=q.device)
    allowed = allowed.expand(2, 4, t_k, t_k)
    scores = (q @ expand_kv_heads(k, 4).transpose(-1, -2) + bias).masked_fill(~allowed,
                                                                              float("-inf"))
    v = torch.eye(t_k, dtype=F64)[None, None].expand(2, 2, t_k, t_k)
    kw = dict(scale=1.0, causal=causal, key_padding_mask=mask, score_bias=bias)
    return q, k, v, kw, scores, allowed


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_kv_keeps_the_most_mass_of_any_budget_keys(seed, causal):
    """Every subset of ``budget`` allowed keys per (batch, KV head, row): none keeps more
    probability summed over the group's heads (softmax per head over its allowed keys) than
    the op's; the group's heads read the same keys, exactly ``budget`` (or all allowed)."""
    budget, t_k = 3, 7
    q, k, v, kw, scores, allowed = _setup(seed, t_k, causal)
    keep = oracle_keep(scores, budget=budget, group="kv", n_kv_heads=2)
    out = oracle_attention(q, k, v, budget=budget, group="kv", **kw)
    assert torch.equal(out > 0, keep)  # the op attends over exactly oracle_keep's keys
    torch.testing.assert_close(oracle_attention_naive(q, k, v, budget=budget, group="kv", **kw),
                               out, rtol=0, atol=1e-14)
    mass = torch.softmax(scores, dim=-1).nan_to_num(0.0).view(2, 2, 2, t_k, t_k).sum(2)
    keep, allowed = keep.view(2, 2, 2, t_k, t_k), allowed.view(2, 2, 2, t_k, t_k)
    assert torch.equal(keep[:, :, 0], keep[:, :, 1])  # one selection per KV group
    for b, g, row in itertools.product(range(2), range(2), range(t_k)):
        keys = allowed[b, g, 0, row].nonzero().flatten().tolist()
        chosen = keep[b, g, 0, row].nonzero().flatten().tolist()
        if len(keys) <= budget:
            assert chosen == keys
            continue
        assert len(chosen) == budget
        kept = mass[b, g, row, chosen].sum().item()
        best = max(mass[b, g, row, list(s)].sum().item()
                   for s in itertools.combinations(keys, budget))
        assert kept >= best - 1e-12, (b, g, row, chosen)


@pytest.mark.parametrize("seed", range(4))
def test_kv_leaves_no_head_without_keys(seed):
    """Every head of every row with an allowed key attends (probabilities summing to 1 over
    keys of nonzero true probability), with a budget of 1."""
    q, k, v, kw, scores, allowed = _setup(seed)
    out = oracle_attention(q, k, v, budget=1, group="kv", **kw)
    has_keys = allowed.any(-1)
    torch.testing.assert_close(out.sum(-1)[has_keys], torch.ones(int(has_keys.sum()), dtype=F64))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    keep = oracle_keep(scores, budget=1, group="kv", n_kv_heads=2)
    assert ((probs * keep).sum(-1)[has_keys] > 0).all()


@pytest.mark.parametrize("seed", range(4))
def test_kv_with_the_group_reads_of_head_keeps_at_least_its_mass(seed):
    """``head`` with budget k reads up to G * k keys per KV head (G = 2 query heads each);
    ``kv`` with budget G * k keeps at least as much summed probability."""
    *_, scores, _ = _setup(seed, t_k=9, causal=False)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    def kept(group, budget):
        keep = oracle_keep(scores, budget=budget, group=group, n_kv_heads=2)
        return (probs * keep).sum(-1).view(2, 2, 2, 9).sum(2)
    assert (kept("kv", 4) >= kept("head", 2) - 1e-12).all()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_page_oracle_keeps_the_most_mass_of_any_pages(seed, causal):
    """Pages of 2 real keys (counted by rank, so padding does not move them), 2 pages per
    row: no other 2 pages with a readable key keep more probability summed over the group's
    heads; every query head of the group reads exactly the chosen pages' allowed keys."""
    page, n_pages, t_k = 2, 2, 9
    q, k, v, kw, scores, allowed = _setup(seed, t_k, causal)
    out = oracle_attention(q, k, v, budget=page * n_pages, page=page, **kw)
    keep = (out > 0).view(2, 2, 2, t_k, t_k)
    assert torch.equal(keep[:, :, 0], keep[:, :, 1])  # one selection per KV group
    mass = torch.softmax(scores, dim=-1).nan_to_num(0.0).view(2, 2, 2, t_k, t_k).sum(2)
    allowed = allowed.reshape(2, 2, 2, t_k, t_k)[:, :, 0]
    mask = kw["key_padding_mask"]
    for b, g, row in itertools.product(range(2), range(2), range(t_k)):
        real = mask[b].nonzero().flatten().tolist()
        pages = [real[i:i + page] for i in range(0, len(real), page)]
        readable = [p for p in pages if allowed[b, g, row, p].any()]
        chosen = keep[b, g, 0, row].nonzero().flatten().tolist()
        if len(readable) <= n_pages:
            assert chosen == allowed[b, g, row].nonzero().flatten().tolist()
            continue
        assert sorted(chosen) == sorted(j for p in pages for j in p
                                        if allowed[b, g, row, j] and any(c in p for c in chosen))
        assert sum(any(c in p for c in chosen) for p in pages) == n_pages
        best = max(sum(mass[b, g, row, j].item() for p in subset for j in p)
                   for subset in itertools.combinations(readable, n_pages))
        assert mass[b, g, row, chosen].sum().item() >= best - 1e-12, (b, g, row, chosen)


def test_pages_of_one_key_are_the_key_oracle():
    q, k, v = _qkv()
    kw = dict(scale=0.3, budget=5, key_padding_mask=_mask())
    torch.testing.assert_close(oracle_attention(q, k, v, page=1, **kw),
                               oracle_attention(q, k, v, **kw), rtol=0, atol=0)


@pytest.mark.parametrize("group", ["kv", "head"])
def test_a_bias_shared_by_the_heads_is_the_same_bias_for_each_head(group):
    """A score bias of one head (``[B, 1, Tq, Tk]``) acts as that bias repeated per head,
    and the blocked path equals the one-matrix reference with it."""
    q, k, v = _qkv()
    bias = torch.randn(2, 1, 37, 37, generator=torch.Generator().manual_seed(3), dtype=F64)
    kw = dict(scale=0.3, budget=5, group=group, key_padding_mask=_mask())
    shared = oracle_attention(q, k, v, score_bias=bias, **kw)
    torch.testing.assert_close(shared, oracle_attention(
        q, k, v, score_bias=bias.expand(2, 4, 37, 37), **kw), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(shared, oracle_attention_naive(q, k, v, score_bias=bias, **kw),
                               rtol=1e-12, atol=1e-12)


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
    with pytest.raises(ValueError, match="k 6 is not a whole number of pages of 4 keys"):
        oracle_attention(q, k, v, scale=0.3, budget=6, page=4)
    with pytest.raises(ValueError, match="page 4 needs group 'kv'"):
        oracle_attention(q, k, v, scale=0.3, budget=8, page=4, group="head")
