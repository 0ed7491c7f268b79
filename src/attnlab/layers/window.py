"""``window`` core: attention sinks plus a sliding window (StreamingLLM), training-free.

Each query attends to the first ``sinks`` real keys and the last ``window`` real keys up to
itself (:func:`attnlab.ops.attention.window_attention`), exact softmax over those. A
reference point for SEA: a fixed, content-blind selection of ``sinks + window`` keys per row.

Decoding needs no state of its own. In an attnlab model the layer's KV cache keeps only the
keys later queries can reach (:meth:`WindowCore.cache_columns`: the sinks and the last
``window - 1`` keys, with their true positions), so memory and cost per step stop growing with
the context and cached decoding still equals the full pass. In a Hugging Face model the KV
cache belongs to the model (transformers' ``DynamicCache``) and keeps every key: the core
reads only the sinks and the window from it, so the cost of a step is bounded but the memory
is not (see the "window" notes in docs/attention.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from attnlab.config import ConfigError
from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.registry import CORES
from attnlab.ops.attention.window import (
    WINDOW_EXECUTORS,
    check_window,
    window_attention,
    window_cache_columns,
)
from attnlab.ops.sparse_attention.executors import check_executor


@dataclasses.dataclass(frozen=True)
class WindowOptions:
    """``sinks``: first real keys every query attends to (StreamingLLM's 4); ``window``: the
    latest real keys (the query's own included); ``executor``: what computes it (``auto``,
    ``native``, ``flex``, ``torch``: :mod:`attnlab.ops.sparse_attention.executors`; the
    window has no ``triton`` path)."""

    sinks: int = 4
    window: int = 1024
    executor: str = "auto"

    def validate(self) -> None:
        check_window(self.sinks, self.window)
        check_executor(self.executor, WINDOW_EXECUTORS)


class WindowCore(AttentionCore):
    """Causal sink + sliding-window attention over the layer's q, k, v."""

    causal = True

    def __init__(self, options: WindowOptions) -> None:
        super().__init__()
        self.sinks, self.window, self.executor = options.sinks, options.window, options.executor

    def extra_repr(self) -> str:
        return f"sinks={self.sinks}, window={self.window}, executor={self.executor!r}"

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
        return CoreOutput(window_attention(
            q, k, v, scale=scale, sinks=self.sinks, window=self.window,
            key_padding_mask=key_padding_mask,
            score_bias=None if score_bias is None else score_bias.at, executor=self.executor))


    def cache_columns(self, key_padding_mask: Tensor | None, n_keys: int) -> Tensor:
        return window_cache_columns(key_padding_mask, n_keys, sinks=self.sinks,
                                    window=self.window)


@CORES.register("window", WindowOptions, score_bias=True, budget=("sinks", "window"),
                marker="s")
def _window(ctx: LayerContext, options: WindowOptions, dropout: float) -> WindowCore:
    """Attention sinks + a sliding window (StreamingLLM): a fixed selection of keys."""
    if not ctx.causal:
        raise ConfigError("the window core is causal (StreamingLLM): use it in a causal model, "
                          "or another core (sdpa, eager, sea, performer) for bidirectional "
                          "attention")
    return WindowCore(options)
