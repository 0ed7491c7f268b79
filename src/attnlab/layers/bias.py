"""Score biases as functions of (batch, head, query, key), not as materialised tensors.

A position scheme that biases attention scores returns a :class:`ScoreBias`: one elementwise
function of broadcastable index tensors, with the softmax scale already folded in. Each core
evaluates it where it needs it: densely over a whole ``[B, H, Tq, Tk]`` block (``sdpa``,
``eager``), at the query/key positions of one block (``window``), or inside a fused kernel as
a FlexAttention ``score_mod`` (``flex``); the ``[Tq, Tk]`` matrix need not exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
"""``fn(b, h, i, j) -> bias``: broadcastable long index tensors of the batch row, the query
head, the query (``0..Tq-1``) and the key (``0..Tk-1``) in, the additive bias out (shaped by
broadcasting; an index the bias does not depend on may be ignored)."""


@dataclasses.dataclass(frozen=True)
class ScoreBias:
    """An additive score bias over ``batch x heads x n_queries x n_keys`` index pairs.

    ``fn`` follows :data:`BiasFn`. Indices are positions in the current call (query ``i`` is
    the ``i``-th of the ``Tq`` queries, key ``j`` the ``j``-th of the ``Tk`` keys, cached keys
    first); a scheme that needs token positions captures them when it builds the bias.
    """

    fn: BiasFn
    batch: int
    heads: int
    n_queries: int
    n_keys: int
    device: torch.device

    def _batch_head(self) -> tuple[Tensor, Tensor]:
        b = torch.arange(self.batch, device=self.device)[:, None, None, None]
        h = torch.arange(self.heads, device=self.device)[None, :, None, None]
        return b, h

    def at(self, queries: Tensor, keys: Tensor) -> Tensor:
        """The bias at query indices ``queries`` and key indices ``keys``, two long tensors
        that broadcast against ``[B, H, n, m]`` (e.g. ``[n, 1]`` and ``[1, m]`` for a block,
        or ``[n, 1]`` and ``[B, H, n, m]`` for ``m`` selected keys per row):
        ``[B or 1, H or 1, n, m]``."""
        b, h = self._batch_head()
        out = self.fn(b, h, queries, keys)
        return out if out.dim() == 4 else out.reshape((1,) * (4 - out.dim()) + out.shape)

    def dense(self) -> Tensor:
        """``[B or 1, H or 1, Tq, Tk]``: the bias of every pair."""
        queries = torch.arange(self.n_queries, device=self.device)[:, None]
        return self.at(queries, torch.arange(self.n_keys, device=self.device)[None, :])

    def score_mod(self) -> Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]:
        """The bias as FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)``."""
        fn = self.fn

        def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score + fn(b, h, i, j)

        return score_mod
