"""SEA's sparse mask: per-row relative bins, grouped top-k of estimated cells, decompression.

A query row ``t`` sees ``L_t`` keys (its causal prefix, or the unpadded length), addressed by
*rank* ``r in [0, L_t)`` (the r-th visible real key). The compressed estimate has ``K`` bins
per row, stretched over that row's own keys: bin ``b`` covers ranks
``[edge(b), edge(b + 1))`` with ``edge(b) = round(b * L_t / K)`` rounded half away from zero
(``torch.round`` rounds half to even, which moves 2.7 % of SEA's bins).

Per rank, with ``c = (r + 0.5) * K / L_t``, those edges put rank ``r`` in bin
``ceil(c) - 1``. The plain floor-of-centre rule ``floor(c)`` would differ at exact ties,
``c`` an integer (``(2r + 1) K = 2 m L_t``, e.g. ``L_t = 96, K = 64, r = 1``), taking the
next bin; SEA's code computes ``floor(c - 1e-4)``, which sends those ties to the lower bin as
the edges do (it can differ only where ``c`` lies within 1e-4 above an integer without being
one, which needs ``L_t > 5000``). :func:`rank_bins` and :func:`dense_mask_reference` follow
the edges, so the reference and :func:`decompress` agree exactly; tests check both facts.

All arithmetic on edges is exact integer arithmetic.
"""

from __future__ import annotations

import torch
from torch import Tensor

GROUPS = ("heads", "head", "batch")


def bin_edges(lengths: Tensor, n_bins: int) -> Tensor:
    """``round_half_away(b * L / K)`` for ``b = 0..K``: int64 ``[..., K + 1]`` from ``[...]``."""
    b = torch.arange(n_bins + 1, device=lengths.device)
    return (2 * b * lengths.long().unsqueeze(-1) + n_bins).div(2 * n_bins, rounding_mode="floor")


def rank_bins(lengths: Tensor, n_ranks: int, n_bins: int) -> tuple[Tensor, Tensor]:
    """Bin of every rank (``ceil((r + 0.5) K / L) - 1``, the bin whose half-away edges hold
    it), and whether the rank exists.

    lengths ``[...]`` -> (bins int64 ``[..., n_ranks]`` clamped to ``[0, K)``, valid bool
    ``[..., n_ranks]`` = ``rank < L``).
    """
    r = torch.arange(n_ranks, device=lengths.device)
    length = lengths.long().unsqueeze(-1)
    bins = ((2 * r + 1) * n_bins - 1).div(2 * length.clamp_min(1), rounding_mode="floor")
    return bins.clamp_max(n_bins - 1), r < length


def cell_budget(lengths: Tensor, k: int, n_bins: int, n_heads: int = 1) -> Tensor:
    """Cells a row may select: ``round_half_away(n_heads * k * K / L)`` clamped to
    ``[1, n_heads * K]``, or 0 for a row with no keys. int64, shape of ``lengths``."""
    length = lengths.long()
    budget = (2 * n_heads * k * n_bins + length).div(2 * length.clamp_min(1), rounding_mode="floor")
    return torch.where(length > 0, budget.clamp(1, n_heads * n_bins), 0)


def select_cell_list(
    probs: Tensor, lengths: Tensor, k: int, *, group: str = "heads"
) -> tuple[Tensor, Tensor, Tensor]:
    """Top cells of the estimated compressed attention, within each row's budget, as a list.

    Args:
        probs: ``[B, H, T, K]`` estimated attention over each row's bins; cells of empty bins
            (no key) must hold a negative value so they are never picked.
        lengths: ``[B, T]`` keys visible to each row (``L_t``).
        k: keys per head the budget is sized for.
        group: ``"heads"`` ranks a row's ``H * K`` cells jointly across heads with budget
            ``H * k * K / L_t`` (so heads get uneven shares, possibly none: SEA's causal
            default); ``"head"`` ranks each head's ``K`` cells with budget ``k * K / L_t``;
            ``"batch"`` ranks all ``H * T * K`` cells of a sample jointly with budget
            ``H * k * K`` cells (SEA's bidirectional default: keys allocated freely across
            rows and heads, on average ``H * k`` keys per row when every row sees the same
            ``L`` keys; a row's selection then depends on every other row, so it is for
            bidirectional attention only). Rows to leave out get a negative ``probs``.
    Returns:
        (head, bin, keep), each ``[B, T, C]``: the row's candidate cells, padded to the
        largest budget (``"batch"``: to the most cells any row got); ``keep`` marks the
        selected ones (head/bin of the others are valid indices but meaningless).
    """
    if group not in GROUPS:
        raise ValueError(f"group must be one of {list(GROUPS)}, got {group!r}")
    if group == "batch":
        return _select_across_rows(probs, k)
    b, h, t, n_bins = probs.shape
    # never more cells than the row has non-empty bins (L_t < K leaves some empty): the
    # selection is the same, and the padded cell list stays short for short rows
    filled = lengths.long().clamp_max(n_bins)
    if group == "heads":
        flat = probs.permute(0, 2, 1, 3).reshape(b, t, h * n_bins)
        budget = torch.minimum(cell_budget(lengths, k, n_bins, h), h * filled)
    else:
        flat = probs
        budget = torch.minimum(cell_budget(lengths, k, n_bins), filled).unsqueeze(1)
        budget = budget.expand(b, h, t)
    width = flat.shape[-1]
    m = max(1, int(budget.max())) if budget.numel() else 1
    if m > 0.9 * width:  # a full sort is cheaper than a near-complete top-k
        values, index = flat.sort(dim=-1, descending=True)
        values, index = values[..., :m], index[..., :m]
    else:
        values, index = flat.topk(m, dim=-1)
    keep = (torch.arange(m, device=flat.device) < budget.unsqueeze(-1)) & (values >= 0)
    if group == "heads":
        return index // n_bins, index % n_bins, keep
    heads = torch.arange(h, device=flat.device).view(1, h, 1, 1).expand_as(index)
    return tuple(x.permute(0, 2, 1, 3).reshape(b, t, h * m) for x in (heads, index, keep))


def _select_across_rows(probs: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``group="batch"`` of :func:`select_cell_list`: each sample's top ``H * k * K``
    non-negative cells of all rows, listed per row."""
    b, h, t, n_bins = probs.shape
    flat = probs.reshape(b, h * t * n_bins)
    budget = min(h * k * n_bins, flat.shape[-1])
    values, index = flat.topk(budget, dim=-1)
    chosen = torch.zeros_like(flat, dtype=torch.bool)
    chosen.scatter_(-1, index, values >= 0)
    by_row = chosen.view(b, h, t, n_bins).permute(0, 2, 1, 3).reshape(b, t, h * n_bins)
    m = max(1, int(by_row.sum(-1).max()))
    keep, cell = by_row.to(torch.uint8).topk(m, dim=-1)  # a row's chosen cells first
    return cell // n_bins, cell % n_bins, keep.bool()


def select_cells(
    probs: Tensor, lengths: Tensor, k: int, *, group: str = "heads"
) -> Tensor:
    """:func:`select_cell_list` as a bool mask ``[B, H, T, K]`` (True = selected)."""
    b, h, t, n_bins = probs.shape
    head, bins, keep = select_cell_list(probs, lengths, k, group=group)
    chosen = torch.zeros(b, t, h * n_bins, dtype=torch.bool, device=probs.device)
    chosen.scatter_(-1, head * n_bins + bins, keep)  # the listed cells of a row are distinct
    return chosen.view(b, t, h, n_bins).permute(0, 2, 1, 3)


def cell_runs(
    bins: Tensor, keep: Tensor, lengths: Tensor, n_bins: int, cap: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Listed cells as runs of ranks: (lo, width, count), each int64 ``[B, T, C]``.

    A kept cell of bin ``b`` covers ranks ``[edge(b), edge(b + 1))`` (``width`` of them) and
    keeps ``count = min(width, cap)`` evenly spaced ones (see
    :func:`attnlab.ops.sparse_attention.run_keys`); cells not kept get ``count = 0``.
    bins, keep ``[B, T, C]``; lengths ``[B, T]``.
    """
    if cap < 1:
        raise ValueError(f"the per-bin key cap must be >= 1, got {cap}")
    edges = bin_edges(lengths, n_bins)  # [B, T, K + 1]
    lo, hi = edges.gather(-1, bins), edges.gather(-1, bins + 1)
    width = hi - lo
    return lo, width, torch.where(keep, width.clamp_max(cap), 0)


def decompress(selected: Tensor, lengths: Tensor, cap: int) -> tuple[Tensor, Tensor]:
    """Selected bins -> padded per-row lists of key ranks, at most ``cap`` keys per bin.

    A bin wider than ``cap`` keeps ``cap`` evenly spaced ranks of its range.

    Args:
        selected: bool ``[B, H, T, K]``; lengths: ``[B, T]`` (``L_t``).
    Returns:
        (ranks int64 ``[B, H, T, S]``, valid bool ``[B, H, T, S]``), ``S`` = the largest
        number of keys of any row; ranks of invalid slots are 0.
    """
    if cap < 1:
        raise ValueError(f"the per-bin key cap must be >= 1, got {cap}")
    n_bins = selected.shape[-1]
    edges = bin_edges(lengths, n_bins).unsqueeze(1)  # [B, 1, T, K + 1]
    lo, width = edges[..., :-1], edges[..., 1:] - edges[..., :-1]
    count = torch.where(selected, width.clamp_max(cap), 0)
    ends = count.cumsum(-1)
    total = ends[..., -1]
    n_slots = int(total.max()) if total.numel() else 0
    slots = torch.arange(n_slots, device=selected.device).expand(*total.shape, n_slots)
    bins = torch.searchsorted(ends, slots.contiguous(), right=True).clamp_max(n_bins - 1)

    def at_bin(x: Tensor) -> Tensor:
        return x.expand_as(count).gather(-1, bins)

    offset = slots - at_bin(ends - count)
    # offset o of a bin with n kept of w keys -> rank lo + floor(o * w / n) (o when n == w)
    ranks = at_bin(lo) + (offset * at_bin(width)).div(
        at_bin(count).clamp_min(1), rounding_mode="floor"
    )
    valid = slots < total.unsqueeze(-1)
    return ranks.masked_fill(~valid, 0), valid


def dense_mask_reference(selected: Tensor, lengths: Tensor, n_ranks: int) -> Tensor:
    """Nearest decompression into a dense ``[B, H, T, n_ranks]`` bool mask over ranks (no cap):
    rank ``r < L_t`` is kept when its bin (:func:`rank_bins`) is selected."""
    bins, exists = rank_bins(lengths, n_ranks, selected.shape[-1])
    picked = selected.gather(-1, bins.unsqueeze(1).expand(*selected.shape[:3], n_ranks))
    return picked & exists.unsqueeze(1)
