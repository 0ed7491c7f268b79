"""Score-bias functions: an additive attention-score bias as a function of index tensors.

A :data:`BiasFn` maps broadcastable long tensors of (batch row, query head, query index, key
index) to the bias; an op evaluates it only where it computes scores (a dense block, a block
of query rows, or the gathered keys of sparse cells), so no ``[Tq, Tk]`` matrix need exist.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
"""``fn(b, h, i, j) -> bias``: broadcastable long index tensors of the batch row, the query
head, the query (``0..Tq-1``) and the key (``0..Tk-1``) in, the additive bias out (shaped by
broadcasting; an index the bias does not depend on may be ignored). Elementwise: each output
depends only on the indices at its own position."""


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
    ``i + offset``."""
    if offset == 0:
        return fn

    def shifted(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return fn(b, h, i + offset, j)

    return shifted
