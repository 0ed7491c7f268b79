"""Exact dense attention cores: PyTorch SDPA and the explicit (eager) reference."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torch import Tensor

from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.cost import dense_scores_cost
from attnlab.layers.registry import CORES
from attnlab.ops.attention import sdpa_attention, softmax_attention
from attnlab.ops.attention.activations import check_activation


@dataclasses.dataclass(frozen=True)
class ScoreOptions:
    """How a dense core turns scores into weights (:mod:`attnlab.ops.attention.activations`).

    ``sigmoid_bias``: sigmoid's bias; None = ``-log(max_seq_len)``.
    """

    activation: str = "softmax"
    sigmoid_bias: float | None = None

    def validate(self) -> None:
        check_activation(self.activation)
        if self.sigmoid_bias is not None and self.activation != "sigmoid":
            raise ValueError(f"sigmoid_bias is an option of activation 'sigmoid', not "
                             f"{self.activation!r}")

    def resolved_sigmoid_bias(self, max_seq_len: int) -> float:
        """Sigmoid's bias: the option, or ``-log(max_seq_len)`` when it is None."""
        return -math.log(max_seq_len) if self.sigmoid_bias is None else self.sigmoid_bias


class DenseCore(AttentionCore):
    """Exact ``activation(scale * q k^T + bias) v`` through ``ops.attention``."""

    def __init__(self, ctx: LayerContext, options: ScoreOptions, dropout: float, fn: Any
                 ) -> None:
        super().__init__()
        self.causal = ctx.causal
        self.dropout = dropout
        self.fn = fn
        self.activation = options.activation
        self.sigmoid_bias = options.resolved_sigmoid_bias(ctx.max_seq_len)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"

    def _scoring(self, key_padding_mask: Tensor | None, score_bias: ScoreBias | None
                 ) -> dict[str, Any]:
        return {"causal": self.causal, "key_padding_mask": key_padding_mask,
                "score_bias": None if score_bias is None else score_bias.dense(),
                "activation": self.activation, "sigmoid_bias": self.sigmoid_bias}

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
        out = self.fn(q, k, v, scale=scale, dropout_p=self.dropout if self.training else 0.0,
                      **self._scoring(key_padding_mask, score_bias))
        return CoreOutput(out)

    def attention_weights(
        self, q: Tensor, k: Tensor, v: Tensor, *, scale: float,
        key_padding_mask: Tensor | None = None, score_bias: ScoreBias | None = None,
    ) -> Tensor:
        """``[B, H, Tq, Tk]``: the weights this core applies to the values (no dropout), for
        distillation targets."""
        _, weights = softmax_attention(q, k, v, scale=scale, return_weights=True,
                                       **self._scoring(key_padding_mask, score_bias))
        return weights


@CORES.register("sdpa", ScoreOptions, score_bias=True, dropout=True,
                cost=dense_scores_cost)
def _sdpa(ctx: LayerContext, options: ScoreOptions, dropout: float) -> DenseCore:
    """PyTorch scaled_dot_product_attention (flash / memory-efficient kernels)."""
    return DenseCore(ctx, options, dropout, sdpa_attention)


@CORES.register("eager", ScoreOptions, score_bias=True, dropout=True, cost=dense_scores_cost)
def _eager(ctx: LayerContext, options: ScoreOptions, dropout: float) -> DenseCore:
    """Explicit activation(q k^T) v with the full score matrix (the reference)."""
    return DenseCore(ctx, options, dropout, softmax_attention)
