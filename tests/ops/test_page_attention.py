"""Page selection (Quest, block top-k): what it keeps, query blocks, refusals (against its
loop reference: test_contract)."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention.pages import (
    check_pages,
    paged_attention,
    paged_keep,
)
from attnlab.utils.testing import assert_close

F64 = torch.float64
B, H, HK, T, D = 2, 4, 2, 23, 8
PAD = 5  # left padding of the first row


def inputs(seed: int = 0, t_q: int = T):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t_q, D, generator=gen, dtype=F64, requires_grad=True)
    k, v = (torch.randn(B, HK, T, D, generator=gen, dtype=F64, requires_grad=True)
            for _ in range(2))
    return q, k, v


def padding_mask() -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :PAD] = False
    return mask


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_query_blocks_give_the_one_block_result(monkeypatch, causal):
    """Each block's queries keep their own local pages (a bidirectional block is not the
    last of the keys)."""
    q, k, v = inputs(1)
    kw = dict(scale=0.35, budget=9, page=3, causal=causal, key_padding_mask=padding_mask())
    whole = paged_attention(q, k, v, **kw)
    monkeypatch.setattr("attnlab.ops.attention.pages.QUERY_BLOCK", 4)
    assert_close("blocked", whole[..., PAD:, :], paged_attention(q, k, v, **kw)[..., PAD:, :],
                 1e-12)


@pytest.mark.parametrize("scorer", ["quest", "mean"])
def test_each_kv_head_reads_at_most_its_budget_with_sinks_and_local_keys(scorer):
    q, k, _ = inputs(2)
    budget, page = 9, 3
    keep = paged_keep(q, k, scale=0.35, budget=budget, page=page, scorer=scorer, sink_pages=1,
                      local_pages=1, causal=True, key_padding_mask=None)
    assert keep.shape == (B, HK, T, T)  # one selection per KV head: its query heads share it
    assert keep.sum(-1).max() <= budget
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(T):
        sinks = min(page, i + 1)
        assert keep[..., i, :sinks].all()  # the first page
        own = i // page * page
        assert keep[..., i, own:i + 1].all()  # the query's own page, up to itself
    kept = (keep & allowed).sum(-1)
    assert (kept[..., :budget] == torch.arange(1, budget + 1)).all()  # short rows: every key
    assert (kept[..., 3 * page:] >= 2 * page + 1).all()  # sinks + a chosen page + own key


def test_quest_keeps_the_page_with_the_best_bound():
    """One page holds a key aligned with the query: Quest (and block top-k) pick it."""
    q = torch.zeros(1, 1, 1, 2, dtype=F64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 12, 2, dtype=F64)
    k[0, 0, :, 1] = 1.0  # orthogonal to the query everywhere...
    k[0, 0, 5, 0] = 10.0  # ...but key 5, in page 2 of 4 (pages of 3)
    for scorer in ("quest", "mean"):
        keep = paged_keep(q, k, scale=1.0, budget=9, page=3, scorer=scorer, sink_pages=1,
                          local_pages=1, causal=True, key_padding_mask=None)
        assert keep[0, 0, 0].tolist() == [True] * 6 + [False] * 3 + [True] * 3


@pytest.mark.parametrize("args, words", [
    ((10, 3, 1, 1), "not a whole number of pages"),
    ((6, 3, 1, 1), "leaves none to select"),
    ((6, 0, 1, 1), "page must be >= 1"),
    ((9, 3, 1, 0), "local_pages >= 1"),
])
def test_bad_budgets_are_refused_naming_the_fix(args, words):
    with pytest.raises(ValueError, match=words):
        check_pages(*args)
