"""Score biases as functions of (batch, head, query, key), not as materialised tensors.

A position scheme that biases attention scores returns a :class:`ScoreBias`: one elementwise
function of broadcastable index tensors, with the softmax scale already folded in. Each core
evaluates it where it needs it: densely over a whole ``[B, H, Tq, Tk]`` block (``sdpa``,
``eager``), at the query/key positions of one block (``window``), at each row's selected keys
(``sea``), or inside a fused kernel as a FlexAttention ``score_mod`` (``flex``); the
``[Tq, Tk]`` matrix need not exist. ``fn`` may be a structured form a kernel computes itself
(:class:`~attnlab.ops.attention.bias.DistanceBias`, ALiBi's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from attnlab.ops.attention.bias import BiasFn, dense_bias, evaluate_bias


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

    def at(self, queries: Tensor, keys: Tensor) -> Tensor:
        """The bias at query indices ``queries`` and key indices ``keys``, two long tensors
        that broadcast against ``[B, H, n, m]`` (e.g. ``[n, 1]`` and ``[1, m]`` for a block,
        or ``[n, 1]`` and ``[B, H, n, m]`` for ``m`` selected keys per row):
        ``[B or 1, H or 1, n, m]``."""
        return evaluate_bias(self.fn, self.batch, self.heads, queries, keys)

    def dense(self) -> Tensor:
        """``[B or 1, H or 1, Tq, Tk]``: the bias of every pair."""
        queries = torch.arange(self.n_queries, device=self.device)
        return dense_bias(self.fn, self.batch, self.heads, queries, self.n_keys)

    def score_mod(self) -> Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]:
        """The bias as FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx)``."""
        fn = self.fn

        def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return score + fn(b, h, i, j)

        return score_mod
