"""sigma-MoE feed-forward block (Csordas et al., 2023), the MLP of SwitchAll.

``y = sum_{e in topk(s)} s[e] * W2_e act(W1_e x)`` with ``s = sigmoid(x W_S)`` (float32), K of
``n_experts`` experts of ``expert_size`` hidden units each, gates not renormalised. Regularised
by the "global" entropy term: the entropy of the batch-mean softmax selection distribution
(see :func:`selection_entropy_gap`), returned already weighted as an auxiliary loss.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.base import Aux, init_linear_
from attnlab.layers.mlp import ACTIVATIONS, MLPContext
from attnlab.layers.registry import MLPS
from attnlab.layers.switchhead import expert_mm, init_selection_, select_experts, selection_logits
from attnlab.ops.expert_matmul import expert_matmul_macs

ENTROPY_KEY = "sigma_moe_entropy_reg"


def selection_entropy_gap(logits: Tensor) -> Tensor:
    """``log(E) - H(mean_n softmax(logits[n]))`` for ``logits [N, E]`` (a scalar, >= 0).

    Zero when the batch-mean selection distribution is uniform: sigma-MoE's "global" entropy
    regulariser (maximise that entropy), offset by the constant ``log E`` so the value reads
    as a distance from uniform. Computed in log space.
    """
    log_mean = torch.logsumexp(F.log_softmax(logits, dim=-1), dim=0) - math.log(logits.shape[0])
    return math.log(logits.shape[-1]) + (log_mean.exp() * log_mean).sum()


@dataclasses.dataclass(frozen=True)
class SigmaMoEOptions:
    """``n_experts`` experts of ``expert_size`` units, ``k`` active per token.

    ``expert_size`` None takes ``d_ff / n_experts`` from the model (which must divide); when
    set, the model's ``d_ff`` is ignored. ``entropy_reg``: coefficient of the global entropy
    regulariser (paper: 1e-4 at 47M, 1e-3 at 262M), added only in training. ``expert_dropout``:
    training-only expert dropout of the ranking (paper 262M: 0.1).
    """

    n_experts: int = 16
    expert_size: int | None = 128
    k: int = 4
    activation: str = "relu"
    entropy_reg: float = 1e-4
    expert_dropout: float = 0.0

    def validate(self) -> None:
        if self.n_experts < 1:
            raise ValueError(f"n_experts must be >= 1, got {self.n_experts}")
        if not 1 <= self.k <= self.n_experts:
            raise ValueError(f"k must be in [1, n_experts={self.n_experts}], got {self.k}")
        if self.expert_size is not None and self.expert_size < 1:
            raise ValueError(f"expert_size must be >= 1 or null, got {self.expert_size}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {self.activation!r}; choices: {sorted(ACTIVATIONS)}"
            )
        if self.entropy_reg < 0:
            raise ValueError(f"entropy_reg must be >= 0, got {self.entropy_reg}")
        if not 0.0 <= self.expert_dropout < 1.0:
            raise ValueError(f"expert_dropout must be in [0, 1), got {self.expert_dropout}")


class SigmaMoE(nn.Module):
    """``x [B, T, d] -> (y [B, T, d], aux)``.

    Parameters: ``up [E, d, S]``, ``down [E, S, d]``, ``sel [E, d]``. Init: ``up`` with fan-in
    d, ``down`` with fan-in ``E * S`` (as the dense layer of the same total width), ``sel``
    with renormalised rows. Dropout (the model's rate) acts on the hidden units.
    """

    def __init__(self, ctx: MLPContext, options: SigmaMoEOptions) -> None:
        super().__init__()
        e = options.n_experts
        size = options.expert_size
        if size is None:
            if ctx.d_ff % e:
                raise ValueError(f"d_ff={ctx.d_ff} is not divisible by n_experts={e}; "
                                 "set expert_size explicitly")
            size = ctx.d_ff // e
        self.opts, self.expert_size = options, size
        self.up = nn.Parameter(torch.empty(e, ctx.d_model, size))
        self.down = nn.Parameter(torch.empty(e, size, ctx.d_model))
        self.sel = nn.Parameter(torch.empty(e, ctx.d_model))
        init_linear_(self.up, ctx.d_model, ctx.init_scale)
        init_linear_(self.down, e * size, ctx.init_scale)
        init_selection_(self.sel, ctx.d_model, ctx.init_scale)
        self.act = ACTIVATIONS[options.activation]
        self.dropout = nn.Dropout(ctx.dropout)

    def forward(self, x: Tensor) -> tuple[Tensor, Aux]:
        opts = self.opts
        x2 = x.reshape(-1, x.shape[-1])
        logits = selection_logits(x2, self.sel)  # [N, E]
        dropout = opts.expert_dropout if self.training else 0.0
        chosen = select_experts(logits[:, None], opts.k, mode="sigmoid", dropout=dropout)
        hidden = expert_mm(x2, self.up, chosen.index, reduce="none")  # [N, 1, k, S]
        hidden = self.dropout(self.act(hidden)).squeeze(1)  # [N, k, S]
        index, gate = chosen.index.transpose(1, 2), chosen.gate.transpose(1, 2)  # [N, k, 1]
        y = expert_mm(hidden, self.down, index, gate, reduce="all")
        aux: Aux = {}
        if self.training and opts.entropy_reg > 0:
            aux[ENTROPY_KEY] = opts.entropy_reg * selection_entropy_gap(logits)
        return y.view(x.shape), aux


def sigma_moe_macs_per_token(d_model: int, d_ff: int, opts: SigmaMoEOptions) -> int:
    """Useful forward MACs of one token: the selection and the k chosen experts' up and
    down projections."""
    size = opts.expert_size or d_ff // opts.n_experts
    return (d_model * opts.n_experts
            + expert_matmul_macs(1, 1, opts.k, d_model, size, "none")
            + expert_matmul_macs(1, opts.k, 1, size, d_model, "all"))


@MLPS.register("sigma_moe", SigmaMoEOptions, macs_per_token=sigma_moe_macs_per_token)
def _sigma_moe(ctx: MLPContext, options: SigmaMoEOptions) -> SigmaMoE:
    """sigma-MoE: sigmoid-gated top-k mixture of small ReLU experts."""
    return SigmaMoE(ctx, options)
