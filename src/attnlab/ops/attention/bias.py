"""Score-bias functions: an additive attention-score bias as a function of index tensors.

A :data:`BiasFn` maps broadcastable long tensors of (batch row, query head, query index, key
index) to the bias; an op evaluates it only where it computes scores (a dense block, a block
of query rows, or the gathered keys of sparse cells), so no ``[Tq, Tk]`` matrix need exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
"""``fn(b, h, i, j) -> bias``: broadcastable long index tensors of the batch row, the query
head, the query (``0..Tq-1``) and the key (``0..Tk-1``) in, the additive bias out (shaped by
broadcasting; an index the bias does not depend on may be ignored). Elementwise: each output
depends only on the indices at its own position."""


@dataclasses.dataclass(frozen=True)
class DistanceBias:
    """A per-head linear distance penalty: ``-slopes[h] * (q_positions[i] - k_positions[j])``
    (``|distance|`` when ``symmetric``), ALiBi's form. A :data:`BiasFn` when called; a kernel
    may instead compute it from the slopes and positions (as FlashAttention's
    ``alibi_slopes``): SEA's native kernel does.

    slopes ``[H]`` (float); q_positions ``[Tq]``, k_positions ``[Tk]``: the token positions
    of the call's queries and keys.
    """

    slopes: Tensor
    q_positions: Tensor
    k_positions: Tensor
    symmetric: bool = False

    def __call__(self, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        distance = (self.q_positions[i] - self.k_positions[j]).to(self.slopes.dtype)
        return -self.slopes[h] * (distance.abs() if self.symmetric else distance)


def evaluate_bias(fn: BiasFn, batch: int, heads: int, queries: Tensor, keys: Tensor) -> Tensor:
    """``fn`` at every batch row and head and at query indices ``queries`` and key indices
    ``keys`` (long tensors broadcasting against ``[B, H, n, m]``, e.g. ``[n, 1]`` and
    ``[1, m]``): ``[B or 1, H or 1, n, m]``."""
    b = torch.arange(batch, device=queries.device)[:, None, None, None]
    h = torch.arange(heads, device=queries.device)[None, :, None, None]
    out = fn(b, h, queries, keys)
    return out if out.dim() == 4 else out.reshape((1,) * (4 - out.dim()) + out.shape)


def dense_bias(fn: BiasFn, batch: int, heads: int, queries: Tensor, n_keys: int) -> Tensor:
    """``[B or 1, H or 1, len(queries), n_keys]``: ``fn`` at the 1-D query indices ``queries``
    against every key."""
    keys = torch.arange(n_keys, device=queries.device)
    return evaluate_bias(fn, batch, heads, queries[:, None], keys[None, :])


def offset_queries(fn: BiasFn, offset: int) -> BiasFn:
    """``fn`` for a slice of the queries starting at ``offset``: its query ``i`` is ``fn``'s
    ``i + offset`` (a :class:`DistanceBias` stays one)."""
    if offset == 0:
        return fn
    if isinstance(fn, DistanceBias):
        return dataclasses.replace(fn, q_positions=fn.q_positions[offset:])

    def shifted(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return fn(b, h, i + offset, j)

    return shifted
