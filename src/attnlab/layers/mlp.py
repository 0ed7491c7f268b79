"""Feed-forward blocks, registered by name (``mlp: dense``); MoE MLPs register here too."""

from __future__ import annotations

import dataclasses

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.base import Aux, init_linear_
from attnlab.layers.registry import MLPS


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


@MLPS.register("dense", DenseMLPOptions)
def _dense(ctx: MLPContext, options: DenseMLPOptions) -> DenseMLP:
    """Two-layer dense feed-forward block."""
    return DenseMLP(ctx, options)
