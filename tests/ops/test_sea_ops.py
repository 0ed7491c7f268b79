"""SEA's mask construction (bins, budgets, grouped top-k, decompression), contexts and loss."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.sea import (
    bin_edges,
    causal_mean,
    cell_budget,
    decompress,
    dense_mask_reference,
    estimate_loss,
    estimate_weighted_mean,
    rank_bins,
    select_cells,
    upsample_logits,
)
from attnlab.ops.sea.loss import attention_distill_loss
from attnlab.ops.sparse_attention import index_mask

F64 = torch.float64


def test_bin_edges_round_half_away_from_zero():
    # 5 keys in 2 bins: the middle edge is 2.5 -> 3 (torch.round would give 2)
    assert bin_edges(torch.tensor(5), 2).tolist() == [0, 3, 5]
    # 6 keys in 4 bins: 1.5 -> 2, 3, 4.5 -> 5
    assert bin_edges(torch.tensor(6), 4).tolist() == [0, 2, 3, 5, 6]
    lengths = torch.arange(1, 700)
    for n_bins in (4, 64, 96, 256):
        edges = bin_edges(lengths, n_bins)
        exact = torch.floor(torch.arange(n_bins + 1, dtype=F64) * lengths[:, None] / n_bins + 0.5)
        assert torch.equal(edges, exact.long())
        assert (edges[:, 0] == 0).all() and torch.equal(edges[:, -1], lengths)
        assert (edges.diff(dim=-1) >= 0).all()


def test_rank_bins_follow_the_edges_and_differ_from_floor_of_centre_only_at_ties():
    r = torch.arange(600)
    for n_bins in (4, 8, 64, 96, 128):
        lengths = torch.arange(1, 600)
        bins, exists = rank_bins(lengths, 600, n_bins)
        edges = bin_edges(lengths, n_bins)
        lo, hi = edges.gather(1, bins), edges.gather(1, bins + 1)
        assert ((lo <= r) & (r < hi))[exists].all()
        num, den = (2 * r + 1) * n_bins, 2 * lengths[:, None]  # centre c = num / den
        floor_centre = (num // den).clamp_max(n_bins - 1)
        tie = num % den == 0
        assert torch.equal((floor_centre != bins) & exists, tie & exists & (num // den < n_bins))
    bins, _ = rank_bins(torch.tensor(96), 96, 64)
    assert bins[1] == 0 and (3 * 64) // (2 * 96) == 1  # the tie r = 1: edges [0, 2) say bin 0
def test_cell_budget():
    lengths = torch.tensor([0, 1, 3, 64, 100, 4096])
    budget = cell_budget(lengths, k=8, n_bins=16, n_heads=4)  # H k K = 512
    assert budget.tolist() == [0, 64, 64, 8, 5, 1]  # 512/100 = 5.12 -> 5; clamps to [1, H K]
    assert cell_budget(torch.tensor([2048]), k=1, n_bins=2).tolist() == [1]
    # half away from zero: H k K / L = 2.5
    assert cell_budget(torch.tensor([8]), k=5, n_bins=4).tolist() == [3]


def _random_selection(b, h, t, n_bins, gen):
    lengths = torch.randint(1, 300, (b, t), generator=gen)
    selected = torch.rand(b, h, t, n_bins, generator=gen) < 0.3
    return selected, lengths


@pytest.mark.parametrize("n_bins", [4, 8, 64])
def test_decompress_equals_the_dense_reference(n_bins):
    gen = torch.Generator().manual_seed(n_bins)
    selected, lengths = _random_selection(2, 3, 40, n_bins, gen)
    ranks, valid = decompress(selected, lengths, cap=10**6)
    dense = dense_mask_reference(selected, lengths, 300)
    assert torch.equal(index_mask(ranks, valid, 300), dense)
    # no key twice within a row
    flat = torch.where(valid, ranks, -1 - torch.arange(ranks.shape[-1]))
    assert (flat.sort(-1).values.diff(dim=-1) != 0).all()
    assert valid.sum(-1).max() == ranks.shape[-1]  # padded to the fullest row exactly


def test_decompress_caps_each_bin_with_evenly_spaced_keys():
    selected = torch.zeros(1, 1, 1, 4, dtype=torch.bool)
    selected[..., 1] = True
    lengths = torch.tensor([[400]])  # bins of 100 keys; bin 1 = ranks [100, 200)
    ranks, valid = decompress(selected, lengths, cap=8)
    assert valid.all() and ranks.shape[-1] == 8
    assert ranks.flatten().tolist() == [100 + 100 * i // 8 for i in range(8)]


def test_decompress_rejects_a_bad_cap():
    with pytest.raises(ValueError, match="cap"):
        decompress(torch.ones(1, 1, 1, 4, dtype=torch.bool), torch.tensor([[4]]), cap=0)


def test_grouped_topk_picks_the_best_cells_within_the_row_budget():
    gen = torch.Generator().manual_seed(0)
    b, h, t, n_bins, k = 2, 4, 30, 8, 3
    probs = torch.rand(b, h, t, n_bins, generator=gen)
    lengths = torch.randint(1, 200, (b, t), generator=gen)
    chosen = select_cells(probs, lengths, k, group="heads")
    filled = lengths.clamp_max(n_bins)  # non-empty bins per head: the budget's upper bound
    budget = torch.minimum(cell_budget(lengths, k, n_bins, h), h * filled)
    assert torch.equal(chosen.sum((1, 3)), budget) and (budget < h * n_bins).any()
    flat_p = probs.permute(0, 2, 1, 3).reshape(b, t, -1)
    flat_c = chosen.permute(0, 2, 1, 3).reshape(b, t, -1)
    worst_kept = flat_p.masked_fill(~flat_c, 2).amin(-1)
    best_dropped = flat_p.masked_fill(flat_c, -1).amax(-1)
    assert (worst_kept > best_dropped).all()

    per_head = select_cells(probs, lengths, k, group="head")
    budget = torch.minimum(cell_budget(lengths, k, n_bins), filled)
    assert torch.equal(per_head.sum(-1), budget[:, None].expand(b, h, t))


def test_batch_topk_picks_a_samples_best_cells_across_rows_and_heads():
    """``group="batch"``: each sample's H k K best non-negative cells of all rows and heads
    (a dense sort of the whole sample is the reference); rows get uneven shares."""
    gen = torch.Generator().manual_seed(1)
    b, h, t, n_bins, k = 2, 3, 20, 8, 2
    probs = torch.rand(b, h, t, n_bins, generator=gen, dtype=F64)
    probs[1, :, 15:] = -1.0  # padded rows of sample 1 select nothing
    chosen = select_cells(probs, torch.full((b, t), 40), k, group="batch")
    for i in range(b):
        flat = probs[i].flatten()
        order = flat.argsort(descending=True)[: h * k * n_bins]
        expected = torch.zeros_like(flat, dtype=torch.bool)
        expected[order[flat[order] >= 0]] = True
        assert torch.equal(chosen[i].flatten(), expected)
    assert chosen.sum((1, 2, 3)).tolist() == [h * k * n_bins] * 2
    assert not chosen[1, :, 15:].any()
    per_row = chosen.sum((1, 3))
    assert per_row.max() > per_row.float().mean() > 0  # allocated freely across rows


def test_empty_cells_are_never_selected():
    probs = torch.rand(1, 2, 5, 8)
    probs[..., 4:] = -1.0  # empty bins
    chosen = select_cells(probs, torch.full((1, 5), 4), k=100, group="heads")
    assert not chosen[..., 4:].any() and chosen[..., :4].all()
    with pytest.raises(ValueError, match="group"):
        select_cells(probs, torch.full((1, 5), 2), k=1, group="rows")


def test_keys_per_row_stay_near_h_times_k():
    """About H * k keys per row whatever the length while bins are at most k wide (L <= K k);
    beyond that the per-bin cap of k keys makes rows sparser still. Linear cost either way."""
    gen = torch.Generator().manual_seed(1)
    h, k, n_bins = 12, 64, 64
    lengths = torch.tensor([[700, 1024, 2048, 4096, 16384]])
    probs = torch.rand(1, h, 5, n_bins, generator=gen)
    ranks, valid = decompress(select_cells(probs, lengths, k), lengths, cap=k)
    nnz = valid.sum((1, 3)).flatten()
    width = lengths.flatten() / n_bins
    capped = torch.minimum(width, torch.tensor(float(k)))
    expected = cell_budget(lengths, k, n_bins, h).flatten() * capped
    assert (abs(nnz - expected) <= capped + 1).all()
    uncapped = width <= k
    assert uncapped[:4].all() and not uncapped[4]
    assert (abs(nnz[uncapped] - h * k) <= 0.15 * h * k).all()
    assert nnz[4] == 3 * k  # budget round(H k K / L) = 3 cells of (capped) k keys


def test_causal_mean_and_weighted_mean_match_loops():
    gen = torch.Generator().manual_seed(2)
    v = torch.randn(2, 3, 7, 4, generator=gen, dtype=F64)
    mask = torch.rand(2, 7, generator=gen) > 0.3
    mask[:, 0] = True
    got, (total, count) = causal_mean(v, mask, t_q=5)
    for b in range(2):
        for i, pos in enumerate(range(2, 7)):
            real = [j for j in range(pos + 1) if mask[b, j]]
            torch.testing.assert_close(got[b, :, i], v[b, :, real].mean(1))
        torch.testing.assert_close(total[b], v[b, :, mask[b]].sum(1))
    torch.testing.assert_close(count, mask.sum(-1).to(F64))
    torch.testing.assert_close(causal_mean(v, None, 7)[0],
                               v.cumsum(2) / torch.arange(1, 8)[:, None])
    # carried from a prefix (a decoding step): the same means as over all values at once
    head, tail = causal_mean(v[:, :, :4], mask[:, :4], t_q=1)[1], (v[:, :, 4:], mask[:, 4:])
    stepped, carry = causal_mean(*tail, t_q=3, prefix=head)
    torch.testing.assert_close(stepped, got[:, :, 2:])
    torch.testing.assert_close(carry[0], total)

    probs = torch.rand(2, 3, 6, 4, generator=gen, dtype=F64)
    lengths = torch.tensor([5, 3])
    qmask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    got = estimate_weighted_mean(v, probs, lengths, qmask)
    for b in range(2):
        mean_p = probs[b, :, : int(qmask[b].sum())].mean(1)  # [H, K]
        edges = bin_edges(lengths[b], 4).tolist()
        bin_of = [next(i for i in range(4) if edges[i] <= r < edges[i + 1])
                  for r in range(int(lengths[b]))]
        want = sum(mean_p[:, bin_of[r], None] * v[b, :, r] for r in range(int(lengths[b])))
        torch.testing.assert_close(got[b, :, 0], want)


def test_estimate_loss_is_zero_at_the_target_and_has_gradients():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 2, 6, 4, generator=gen, dtype=F64, requires_grad=True)
    lengths = torch.tensor([[1, 2, 3, 4, 5, 6]])
    up = upsample_logits(logits, lengths, 6)
    assert torch.isinf(up[0, 0, 0, 1:]).all() and torch.isfinite(up[0, 0, 5]).all()
    target = torch.softmax(up, -1).detach()
    assert estimate_loss(logits, lengths, target).abs() < 1e-12
    other = torch.softmax(torch.randn(1, 2, 6, 6, generator=gen, dtype=F64).masked_fill(
        torch.isinf(up), float("-inf")), -1)
    loss = estimate_loss(logits, lengths, other)
    assert loss > 1e-3
    loss.backward()
    assert logits.grad.abs().sum() > 0 and torch.isfinite(logits.grad).all()
    # a row with nothing visible adds nothing
    empty = attention_distill_loss(torch.full((1, 3), float("-inf")), torch.zeros(1, 3))
    assert empty == 0


def test_the_kl_can_be_divided_by_real_tokens_instead_of_rows():
    """SEA's bidirectional form: the summed KL over ``kl_rows`` (the real tokens), so with H
    heads of T rows it is H * T / kl_rows times the batchmean's."""
    gen = torch.Generator().manual_seed(4)
    student = torch.randn(2, 3, 5, 5, generator=gen, dtype=F64)
    target = torch.softmax(torch.randn(2, 3, 5, 5, generator=gen, dtype=F64), -1)
    mse = (torch.softmax(student, -1) - target).square().mean()
    batchmean = attention_distill_loss(student, target) - mse
    per_token = attention_distill_loss(student, target, kl_rows=8) - mse
    torch.testing.assert_close(per_token, batchmean * (2 * 3 * 5) / 8)
