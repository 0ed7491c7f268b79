"""Dense per-head Q/K/V/O projections (multi-head and grouped-query attention)."""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from attnlab.layers.base import Aux, LayerContext, Projected, Projections, init_linear_
from attnlab.layers.cost import Cost, LayerShape
from attnlab.layers.registry import PROJECTIONS


@dataclasses.dataclass(frozen=True)
class DenseOptions:
    n_kv_heads: int | None = None  # None = n_heads (plain multi-head attention)
    bias: bool = False

    def validate(self) -> None:
        if self.n_kv_heads is not None and self.n_kv_heads < 1:
            raise ValueError(f"n_kv_heads must be >= 1, got {self.n_kv_heads}")


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``[B, T, H*D]`` -> ``[B, H, T, D]``."""
    b, t, _ = x.shape
    return x.view(b, t, n_heads, -1).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``[B, H, T, D]`` -> ``[B, T, H*D]``."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class DenseProjections(Projections):
    """Standard projections: q, k, v = x W_q, x W_k, x W_v; y = concat_h(o_h) W_o."""

    def __init__(self, ctx: LayerContext, options: DenseOptions) -> None:
        super().__init__()
        self.n_heads = ctx.n_heads
        self.n_kv_heads = options.n_kv_heads or ctx.n_heads
        if ctx.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={ctx.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}"
            )
        inner, kv_inner = ctx.n_heads * ctx.d_head, self.n_kv_heads * ctx.d_head
        self.q_proj = nn.Linear(ctx.d_model, inner, bias=options.bias)
        self.k_proj = nn.Linear(ctx.d_model, kv_inner, bias=options.bias)
        self.v_proj = nn.Linear(ctx.d_model, kv_inner, bias=options.bias)
        self.o_proj = nn.Linear(inner, ctx.d_model, bias=options.bias)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            init_linear_(lin.weight, lin.in_features, ctx.init_scale)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        self.score_scale = ctx.d_head**-0.5

    def project(self, x: Tensor) -> Projected:
        return Projected(
            q=split_heads(self.q_proj(x), self.n_heads),
            k=split_heads(self.k_proj(x), self.n_kv_heads),
            v=split_heads(self.v_proj(x), self.n_kv_heads),
        )

    def output(self, o: Tensor, projected: Projected) -> tuple[Tensor, Aux]:
        return self.o_proj(merge_heads(o)), {}


def dense_cost(s: LayerShape, options: DenseOptions) -> Cost:
    """MACs and output floats of dense Q/K/V/O (grouped-query when ``n_kv_heads`` < H)."""
    hk = options.n_kv_heads or s.h
    return s.t * s.d * s.dh * (2 * s.h + 2 * hk), s.t * s.dh * (2 * s.h + 2 * hk)


@PROJECTIONS.register("dense", DenseOptions, cost=dense_cost)
def _dense(ctx: LayerContext, options: DenseOptions) -> DenseProjections:
    """Dense multi-head (or grouped-query) Q/K/V/O projections."""
    return DenseProjections(ctx, options)
