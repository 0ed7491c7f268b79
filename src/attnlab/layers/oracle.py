"""``oracle`` core: exact attention over each row's top keys by true score (evaluation only).

The upper bound of what a key selector with SEA's budget can keep
(:func:`attnlab.ops.attention.oracle_attention`): it computes every score (O(T^2), slower than
dense attention), so it measures quality, never speed. ``k`` is the budget per head as SEA's
``k``; ``group`` as SEA's ``topk_group`` (``"heads"``: a row's ``H * k`` best (head, key)
cells jointly). Causal or bidirectional, with any score bias.

Decoding needs no state of its own: a step scores the new queries against the layer's (or
the Hugging Face model's) cached keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.registry import CORES
from attnlab.ops.attention.oracle import check_oracle, oracle_attention


@dataclasses.dataclass(frozen=True)
class OracleOptions:
    """``k``: keys per head per row (SEA's ``k``); ``group``: ``"heads"`` or ``"head"``."""

    k: int = 256
    group: str = "heads"

    def validate(self) -> None:
        check_oracle(self.k, self.group)


class OracleCore(AttentionCore):
    """Exact softmax over each row's top-``k`` keys per head by true score."""

    def __init__(self, options: OracleOptions, causal: bool) -> None:
        super().__init__()
        self.k, self.group, self.causal = options.k, options.group, causal

    def extra_repr(self) -> str:
        return f"k={self.k}, group={self.group!r}, causal={self.causal}"

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_padding_mask: Tensor | None = None,
        score_bias: ScoreBias | None = None,
        state: Any = None,
    ) -> CoreOutput:
        """q ``[B, H, Tq, D]`` (the last ``Tq`` of the keys), k, v ``[B, Hk, Tk, D]`` ->
        ``[B, H, Tq, D]``; ``key_padding_mask`` ``[B, Tk]``, True = real key."""
        return CoreOutput(oracle_attention(q, k, v, scale=scale, budget=self.k,
                                           group=self.group, causal=self.causal,
                                           key_padding_mask=key_padding_mask,
                                           score_bias=None if score_bias is None
                                           else score_bias.dense()))


@CORES.register("oracle", OracleOptions, score_bias=True, budget=("k",))
def _oracle(ctx: LayerContext, options: OracleOptions, dropout: float) -> OracleCore:
    """Exact attention over each row's top-k keys by true score: the ceiling of key selection."""
    return OracleCore(options, ctx.causal)
