"""Per-expert matmuls over rows sorted by expert id, and the gate-scaled scatter-add.

The rows of ``a`` are sorted by expert; ``counts[e]`` rows belong to expert ``e``. One ``mm``
per non-empty expert writes straight into its slice of the result (no ``cat``).

Why a loop and not ``torch._grouped_mm``: measured on this project's 2-core AMD EPYC (AVX-512,
torch 2.13 CPU), 16384 sorted rows over 10 experts, fp32, median of 20 (one after the other,
not alternated, on a shared machine): 412->76 loop 11.0 ms vs
``_grouped_mm`` 10.4 ms; 76->412 13.0 vs 10.5 ms; the dW form 11.4 vs 10.2 and 9.2 vs 9.0 ms.
``_grouped_mm`` is private, has no float64, needs 16-byte aligned rows in bf16 (so it refuses
d_head=76), and its autograd fails on expanded gradients; the ~10 % is not worth that.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _starts(counts: list[int]) -> list[tuple[int, int, int]]:
    """``(expert, start, stop)`` for every expert with rows."""
    spans, start = [], 0
    for e, c in enumerate(counts):
        if c:
            spans.append((e, start, start + c))
        start += c
    return spans


def segment_mm(a: Tensor, weight: Tensor, counts: list[int], transpose: bool = False) -> Tensor:
    """``a[rows of e] @ weight[e]`` (or ``@ weight[e].T``) for every expert e.

    Shapes: a ``[M, K_a]`` sorted by expert; weight ``[E, K_a, K_b]`` (``[E, K_b, K_a]`` when
    ``transpose``). Returns ``[M, K_b]`` in a's dtype (low-precision GEMMs accumulate in fp32).
    """
    width = weight.shape[1] if transpose else weight.shape[2]
    out = a.new_empty(a.shape[0], width)
    for e, start, stop in _starts(counts):
        w = weight[e].t() if transpose else weight[e]
        torch.mm(a[start:stop], w, out=out[start:stop])
    return out


def segment_outer(a: Tensor, b: Tensor, counts: list[int]) -> Tensor:
    """``a[rows of e].T @ b[rows of e]`` per expert: the weight gradient ``[E, K_a, K_b]``.

    Each expert's sum over its rows is one GEMM, so bf16 inputs are accumulated in fp32 inside
    the GEMM and rounded once. Experts without rows get zeros.
    """
    out = a.new_zeros(len(counts), a.shape[1], b.shape[1])
    for e, start, stop in _starts(counts):
        torch.mm(a[start:stop].t(), b[start:stop], out=out[e])
    return out


def scatter_rows(rows: Tensor, scale: Tensor | None, index: Tensor, n_rows: int) -> Tensor:
    """``out[index[m]] += scale[m] * rows[m]``: ``[M, K] -> [n_rows, K]``, in rows' dtype.

    scale ``[M]`` or None (weight 1); index int64 ``[M]`` in ``[0, n_rows)``. Each output row
    sums at most ``G * k`` (or, for dx, ``G * k`` or ``k``) terms, so the sum stays in the input
    dtype: measured on bf16 at the 47M shapes, the result's error against a float64 truth equals
    the naive reference's (0.40 % both; an fp32 buffer gives 0.36 % but makes the scatter 3-4x
    slower because the ``[M, K]`` rows must be converted).
    """
    vals = rows if scale is None else rows * scale.unsqueeze(1)
    out = torch.zeros(n_rows, rows.shape[1], dtype=rows.dtype, device=rows.device)
    return out.index_add_(0, index, vals)


def row_dots(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum(1)`` accumulated in at least fp32: ``[M, K] x [M, K] -> [M]``."""
    acc = torch.promote_types(a.dtype, torch.float32)
    return torch.linalg.vecdot(a.to(acc), b.to(acc))
