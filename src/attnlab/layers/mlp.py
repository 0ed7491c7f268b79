"""Feed-forward blocks, registered by name (``mlp: dense``, ``mlp: swiglu``); MoE MLPs
register here too."""

from __future__ import annotations

import dataclasses

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.base import Aux, init_linear_
from attnlab.layers.registry import MLPS, NoOptions


@dataclasses.dataclass(frozen=True)
class MLPContext:
    d_model: int
    d_ff: int
    dropout: float
    layer_idx: int
    n_layers: int
    init_scale: float


@dataclasses.dataclass(frozen=True)
class DenseMLPOptions:
    activation: str = "gelu"

    def validate(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; choices: {sorted(ACTIVATIONS)}"
            )


ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}


class DenseMLP(nn.Module):
    """``x [B, T, d] -> act(x W1) W2 -> [B, T, d]``; returns (y, aux) like every MLP."""

    def __init__(self, ctx: MLPContext, options: DenseMLPOptions) -> None:
        super().__init__()
        self.up = nn.Linear(ctx.d_model, ctx.d_ff, bias=False)
        self.down = nn.Linear(ctx.d_ff, ctx.d_model, bias=False)
        init_linear_(self.up.weight, ctx.d_model, ctx.init_scale)
        init_linear_(self.down.weight, ctx.d_ff, ctx.init_scale)
        self.act = ACTIVATIONS[options.activation]
        self.dropout = nn.Dropout(ctx.dropout)

    def forward(self, x: Tensor) -> tuple[Tensor, Aux]:
        return self.down(self.dropout(self.act(self.up(x)))), {}


def dense_macs_per_token(d_model: int, d_ff: int, options: DenseMLPOptions) -> int:
    """Forward MACs of one token: the up and down projections."""
    return 2 * d_model * d_ff


@MLPS.register("dense", DenseMLPOptions, macs_per_token=dense_macs_per_token)
def _dense(ctx: MLPContext, options: DenseMLPOptions) -> DenseMLP:
    """Two-layer dense feed-forward block."""
    return DenseMLP(ctx, options)


class SwiGLUMLP(nn.Module):
    """Llama's gated MLP: ``x [B, T, d] -> (silu(x W_gate) * x W_up) W_down -> [B, T, d]``
    (``d_ff`` = the width of the gate and up projections); returns (y, aux)."""

    def __init__(self, ctx: MLPContext, options: NoOptions) -> None:
        super().__init__()
        self.gate = nn.Linear(ctx.d_model, ctx.d_ff, bias=False)
        self.up = nn.Linear(ctx.d_model, ctx.d_ff, bias=False)
        self.down = nn.Linear(ctx.d_ff, ctx.d_model, bias=False)
        for lin in (self.gate, self.up, self.down):
            init_linear_(lin.weight, lin.in_features, ctx.init_scale)
        self.dropout = nn.Dropout(ctx.dropout)

    def forward(self, x: Tensor) -> tuple[Tensor, Aux]:
        return self.down(self.dropout(F.silu(self.gate(x)) * self.up(x))), {}


def swiglu_macs_per_token(d_model: int, d_ff: int, options: NoOptions) -> int:
    """Forward MACs of one token: the gate, up and down projections."""
    return 3 * d_model * d_ff


@MLPS.register("swiglu", NoOptions, macs_per_token=swiglu_macs_per_token)
def _swiglu(ctx: MLPContext, options: NoOptions) -> SwiGLUMLP:
    """SwiGLU feed-forward block (Llama's)."""
    return SwiGLUMLP(ctx, options)
