"""Exact softmax attention cores: PyTorch SDPA and the explicit (eager) reference."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.registry import CORES, NoOptions
from attnlab.ops.attention import sdpa_attention, softmax_attention


class SoftmaxCore(AttentionCore):
    """Exact ``softmax(scale * q k^T + bias) v`` through ``ops.attention``."""

    def __init__(self, ctx: LayerContext, dropout: float, fn: Any) -> None:
        super().__init__()
        self.causal = ctx.causal
        self.dropout = dropout
        self.fn = fn

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_padding_mask: Tensor | None = None,
        score_bias: Tensor | None = None,
        state: Any = None,
    ) -> CoreOutput:
        out = self.fn(
            q, k, v, scale=scale, causal=self.causal, key_padding_mask=key_padding_mask,
            score_bias=score_bias, dropout_p=self.dropout if self.training else 0.0,
        )
        return CoreOutput(out)


@CORES.register("sdpa", NoOptions, score_bias=True)
def _sdpa(ctx: LayerContext, options: NoOptions, dropout: float) -> SoftmaxCore:
    """PyTorch scaled_dot_product_attention (flash / memory-efficient kernels)."""
    return SoftmaxCore(ctx, dropout, sdpa_attention)


@CORES.register("eager", NoOptions, score_bias=True)
def _eager(ctx: LayerContext, options: NoOptions, dropout: float) -> SoftmaxCore:
    """Explicit softmax(q k^T) v with the full score matrix (the reference)."""
    return SoftmaxCore(ctx, dropout, softmax_attention)
