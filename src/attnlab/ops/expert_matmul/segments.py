"""Rows grouped by expert, one GEMM over all experts, and the gate-scaled scatter-add.

``plan_segments`` stable-sorts the slots by expert and gives every expert one segment of rows
in the ``[P, K]`` buffers: all of length ``C = max(counts)`` ("padded": ``[P, K]`` is
``[E, C, K]``, each GEMM is one ``torch.bmm``, the ``P - M`` pad rows are zero and their
outputs dropped) or of its own count ("ragged": ``P = M``, one ``mm`` per non-empty expert).
It pads while ``E * C <= PAD_MAX_WASTE * M``.

Measurements behind it (2-core AMD EPYC, AVX-512, torch 2.13 CPU, 2 threads, fp32). Balanced
GEMMs alone, 16384 slots over 10 experts (C * E / M = 1.02; median of 15, quiet machine): bmm
412->76 4.1 ms vs 6.3-8.1 ms for the loop of mms (dense [4096, 412] @ [412, 304]: 3.8 ms),
76->412 5.7 vs 6.8 ms (dense 4.6). Whole op, padded time / ragged time, SwitchHead 47M shapes
(V 412->76, O 76->412, 4096 tokens) with the routing skewed towards one expert per head; the
machine was shared and loaded, so these are process CPU times, min of 11 alternated reps
(wall-clock minima agreed)::

    E * C / M        1.02   1.14   1.26   1.53   1.87
    V fwd            0.92   0.95   1.13   1.96   2.35
    V fwd+bwd        0.80   0.98   1.09   1.38   1.95
    O fwd            1.02   1.09   1.28   1.40   2.55
    O fwd+bwd        0.86   0.86   1.08   1.47   1.60

Pads cost more than their share of rows: glibc hands buffers past 32 MiB out as fresh mmaps, so
a ``[P, 412]`` fp32 buffer of P = 28000 rows is page-faulted on every call (12 ms to allocate
and fill vs 4 ms for a gather into an existing one).

Why not ``torch._grouped_mm``: it is private, has no float64, needs 16-byte aligned rows in
bf16 (so it refuses d_head=76), its autograd fails on expanded gradients, and on this machine it
was only ~10 % faster than the loop (the bmm is faster still).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
from torch import Tensor

PAD_MAX_WASTE = 1.2
"""Largest ``E * C / M`` (buffer rows per slot) at which ``plan_segments`` pads: the break-even
of the table in the module docstring."""


@dataclass(frozen=True)
class Segments:
    """Where each slot's row lives in the expert-grouped ``[P, K]`` buffers.

    ``slot[p]``: the slot at position p (0 at pads), int64 ``[P]``; ``pos[m]``: the position of
    slot m, int64 ``[M]``; ``pads``: positions holding no slot, int64 ``[P - M]``;
    ``lengths[e]``: rows of expert e's segment (segments are consecutive, in expert order).
    """

    slot: Tensor
    pos: Tensor
    pads: Tensor
    lengths: list[int]

    @property
    def padded(self) -> bool:
        """All segments have one length C (padded, or equal counts): ``[P, K]`` is ``[E, C, K]``."""
        return len(set(self.lengths)) == 1

    def batched(self, rows: Tensor) -> Tensor:
        """``[P, K]`` rows as ``[E, C, K]`` (only when ``padded``)."""
        return rows.view(len(self.lengths), self.lengths[0], rows.shape[1])


def plan_segments(sel: Tensor, experts: int, max_waste: float | None = None) -> Segments:
    """Stable-sort the slots (``sel`` int64 ``[M]`` in ``[0, E)``) into expert segments, padded
    to a common length when that makes at most ``max_waste * M`` rows (default
    ``PAD_MAX_WASTE``, read at call time; see the module doc)."""
    max_waste = PAD_MAX_WASTE if max_waste is None else max_waste
    m = sel.numel()
    counts_t = torch.bincount(sel, minlength=experts)
    counts = counts_t.tolist()
    width = max(counts, default=0)
    padded = 0 < experts * width <= max_waste * m
    lengths = [width] * experts if padded else counts
    order = torch.argsort(sel, stable=True)
    starts = [0, *accumulate(lengths)][:-1]
    seg_start = torch.tensor(starts, dtype=torch.long, device=sel.device)
    shift = seg_start - (counts_t.cumsum(0) - counts_t)  # segment start - first sorted index
    sorted_pos = shift[sel[order]] + torch.arange(m, device=sel.device)
    slot = sel.new_zeros(sum(lengths)).index_copy_(0, sorted_pos, order)
    pos = torch.empty_like(sorted_pos).index_copy_(0, order, sorted_pos)
    is_pad = torch.ones(slot.shape, dtype=torch.bool, device=sel.device).index_fill_(
        0, sorted_pos, False
    )
    return Segments(slot, pos, is_pad.nonzero().squeeze(1), lengths)


def gather_rows(src: Tensor, index: Tensor, seg: Segments) -> Tensor:
    """``src[index]`` with the pad rows zeroed: ``[rows, K] -> [P, K]``."""
    return src.index_select(0, index).index_fill_(0, seg.pads, 0)


def segment_mm(
    a: Tensor, weight: Tensor, seg: Segments, transpose: bool = False, out: Tensor | None = None
) -> Tensor:
    """``a[segment e] @ weight[e]`` (or ``@ weight[e].T``) for every expert e.

    Shapes: a ``[P, K_a]`` grouped as ``seg``; weight ``[E, K_a, K_b]`` (``[E, K_b, K_a]``
    when ``transpose``). Returns ``[P, K_b]`` in a's dtype (low-precision GEMMs accumulate in
    fp32), written into ``out`` (contiguous ``[P, K_b]``, not overlapping a) when given. Pad
    rows of the result are whatever zero rows give (zeroed again at the scatter).
    """
    # a contiguous W^T: bmm on the transposed view was up to 1.3x slower (412->76 dx: 5.9 vs 4.5 ms)
    w = weight.transpose(1, 2).contiguous() if transpose else weight
    out = a.new_empty(a.shape[0], w.shape[2]) if out is None else out
    if seg.padded:
        torch.bmm(seg.batched(a), w, out=seg.batched(out))
        return out
    for e, start, stop in _spans(seg.lengths):
        torch.mm(a[start:stop], w[e], out=out[start:stop])
    return out


def segment_outer(a: Tensor, b: Tensor, seg: Segments) -> Tensor:
    """``a[segment e].T @ b[segment e]`` per expert: the weight gradient ``[E, K_a, K_b]``.

    Each expert's sum over its rows is one GEMM, so bf16 inputs are accumulated in fp32 inside
    the GEMM and rounded once; pad rows are zero and add nothing. Experts without rows get
    zeros. The GEMM always produces the ``[K_small, K_large]`` orientation (transposed back
    when needed): balanced, as in the module docstring, bmm ``[76, C] @ [C, 412]`` took
    3.7-5.1 ms against 5.2-6.4 ms for ``[412, C] @ [C, 76]``.
    """
    if a.shape[1] > b.shape[1]:
        return segment_outer(b, a, seg).transpose(1, 2).contiguous()
    if seg.padded:
        return torch.bmm(seg.batched(a).transpose(1, 2), seg.batched(b))
    out = a.new_zeros(len(seg.lengths), a.shape[1], b.shape[1])
    for e, start, stop in _spans(seg.lengths):
        torch.mm(a[start:stop].t(), b[start:stop], out=out[e])
    return out


def _spans(lengths: list[int]) -> list[tuple[int, int, int]]:
    """``(expert, start, stop)`` for every non-empty segment."""
    spans = zip(lengths, accumulate(lengths), strict=True)
    return [(e, stop - n, stop) for e, (n, stop) in enumerate(spans) if n]


def scatter_rows(
    rows: Tensor, scale: Tensor | None, index: Tensor, n_rows: int, seg: Segments
) -> Tensor:
    """``out[index[p]] += scale[p] * rows[p]`` over the non-pad positions: ``[P, K] ->
    [n_rows, K]``, in rows' dtype. scale ``[P]`` or None (weight 1); index int64 ``[P]``.

    Pad rows are zeroed first (they point at some valid row and must add nothing, even where
    a weight is inf); with ``scale`` None that zeroes them in ``rows`` itself. Each output row
    sums at most ``G * k`` (or, for dx, ``G * k`` or ``k``) terms, so the sum stays in the input
    dtype: measured on bf16 at the 47M shapes, the result's error against a float64 truth
    equals the naive reference's (0.40 % both; an fp32 buffer gives 0.36 % but makes the
    scatter 3-4x slower because the ``[M, K]`` rows must be converted).
    """
    vals = rows if scale is None else rows * scale.unsqueeze(1)
    vals = vals.index_fill_(0, seg.pads, 0) if seg.pads.numel() else vals
    out = torch.zeros(n_rows, rows.shape[1], dtype=rows.dtype, device=rows.device)
    return out.index_add_(0, index, vals)


def row_dots(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum(1)``, the products in the input dtype (as the reference's autograd forms
    them), the sum accumulated in at least fp32: ``[P, K] x [P, K] -> [P]``. Converting bf16
    rows to fp32 first cost 3.4 ms instead of 0.6 ms at ``[16730, 76]``."""
    return torch.mul(a, b).sum(1, dtype=torch.promote_types(a.dtype, torch.float32))
