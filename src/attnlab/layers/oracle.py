"""``oracle`` core: exact attention over each row's oracle keys (evaluation only).

The upper bound of what a key selector with SEA's budget can keep
(:func:`attnlab.ops.attention.oracle_attention`): it computes every score (O(T^2), slower than
dense attention), so it measures quality, never speed. ``group``:

* ``"kv"`` (default, the ceiling): ``k`` is the keys per KV head per row. Per KV head and
  query row it keeps the ``k`` keys with the largest attention probability summed over the
  group's query heads (softmax per head over its allowed keys, score bias included), and
  every query head of the group attends (exact softmax) to exactly those keys. The mass kept,
  summed over the group's heads, is additive over keys, so these ``k`` keys keep more of it
  than any other ``k``: no selector reading ``k`` keys per KV head per row keeps more (a
  bound on the mass kept per layer, not on perplexity, which a selector can tie).
* ``"head"``: ``k`` keys per query head, each its own top scores (a GQA group reads up to
  ``(H / Hk) * k`` keys per KV head);
* ``"heads"``: as SEA's ``topk_group="heads"``, a row's ``H * k`` best (head, key) raw
  scores jointly (arbitrary across heads, since softmax ignores a per-head shift; a head can
  get no key).

``page`` (``"kv"``): keep whole pages of ``page`` keys, ``k // page`` per row, the ones of
largest summed probability: the ceiling of the page selectors (``quest``, ``block``,
``sea_pages``) at that page size.

Causal or bidirectional, with any score bias. Decoding needs no state of its own: a step
scores the new queries against the layer's (or the Hugging Face model's) cached keys.
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
    """``k``: keys per row per KV head (``group="kv"``) or per query head (``"head"``, as
    SEA's ``k``), or ``H * k`` (head, key) cells per row (``"heads"``); ``group``: ``"kv"``,
    ``"head"`` or ``"heads"`` (see the module); ``page``: keys per unit kept (``"kv"``)."""

    k: int = 256
    group: str = "kv"
    page: int = 1

    def validate(self) -> None:
        check_oracle(self.k, self.group, self.page)


class OracleCore(AttentionCore):
    """Exact softmax over each row's oracle keys: ``k`` per KV head (``group="kv"``)."""

    def __init__(self, options: OracleOptions, causal: bool) -> None:
        super().__init__()
        self.k, self.group, self.page, self.causal = options.k, options.group, options.page, causal

    def extra_repr(self) -> str:
        return f"k={self.k}, group={self.group!r}, page={self.page}, causal={self.causal}"

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
                                           group=self.group, page=self.page,
                                           causal=self.causal,
                                           key_padding_mask=key_padding_mask,
                                           score_bias=None if score_bias is None
                                           else score_bias.dense()))


@CORES.register("oracle", OracleOptions, score_bias=True, budget=("k",), marker="^")
def _oracle(ctx: LayerContext, options: OracleOptions, dropout: float) -> OracleCore:
    """Exact attention over each row's k keys of most attention: the most any selection of k
    keys keeps."""
    return OracleCore(options, ctx.causal)
