"""Mixture of Attention heads (MoA, Zhang et al. 2022), as the SwitchHead paper compared it.

One shared K and one shared V projection (``Hk = 1``, broadcast over heads); E query experts
and E output experts. A softmax router over the E experts picks ``H = n_heads`` of them per
token (gates renormalised over the chosen ones, i.e. a softmax over their logits); chosen
expert ``e`` is attention head slot h (slots in decreasing router probability):

``q_h = x W_Q^e``, ``y = sum_h g_h o_h W_O^e``, scores scaled by ``d_head ** -0.5``.

Auxiliary losses (training only, already weighted): the switch load-balancing loss
``E * sum_e f_e P_e`` (f: share of head slots routed to e, P: mean router probability) and
the router z-loss ``mean(logsumexp(logits) ** 2)``. They average over every token given,
padding included (the projections do not see the padding mask).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from attnlab.layers.base import Aux, LayerContext, Projected, Projections, init_linear_
from attnlab.layers.cost import Cost, LayerShape
from attnlab.layers.projections import split_heads
from attnlab.layers.registry import PROJECTIONS
from attnlab.layers.switchhead import expert_mm, init_selection_, select_experts, selection_logits
from attnlab.ops.expert_matmul import expert_matmul_macs


@dataclasses.dataclass(frozen=True)
class MoAOptions:
    """``n_experts``: E query/output experts (must be >= the layer's n_heads, which is how
    many are chosen per token). ``switch_loss`` / ``z_loss``: coefficients of the auxiliary
    losses (the MoA reference run: 0.01 and 0.001)."""

    n_experts: int = 8
    switch_loss: float = 0.01
    z_loss: float = 0.001

    def validate(self) -> None:
        if self.n_experts < 1:
            raise ValueError(f"n_experts must be >= 1, got {self.n_experts}")
        for name in ("switch_loss", "z_loss"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


class MoAProjections(Projections):
    """q ``[B, H, T, D]`` from the chosen query experts; k, v ``[B, 1, T, D]`` shared.

    Parameters: ``router [E, d]``, ``q_experts [E, d, D]``, ``o_experts [E, D, d]`` (fan-in
    ``H * D``), ``k_proj``/``v_proj`` ``nn.Linear(d, D)`` without bias.
    """

    def __init__(self, ctx: LayerContext, options: MoAOptions) -> None:
        super().__init__()
        if options.n_experts < ctx.n_heads:
            raise ValueError(
                f"moa picks n_heads={ctx.n_heads} of n_experts={options.n_experts} per token; "
                "n_experts must be >= n_heads"
            )
        self.opts = options
        e, d, dh = options.n_experts, ctx.d_model, ctx.d_head
        self.n_heads, self.d_head = ctx.n_heads, dh
        self.router = nn.Parameter(torch.empty(e, d))
        self.q_experts = nn.Parameter(torch.empty(e, d, dh))
        self.o_experts = nn.Parameter(torch.empty(e, dh, d))
        self.k_proj = nn.Linear(d, dh, bias=False)
        self.v_proj = nn.Linear(d, dh, bias=False)
        init_selection_(self.router, d, ctx.init_scale)
        for weight, fan_in in ((self.q_experts, d), (self.o_experts, ctx.n_heads * dh),
                               (self.k_proj.weight, d), (self.v_proj.weight, d)):
            init_linear_(weight, fan_in, ctx.init_scale)
        self.score_scale = dh**-0.5

    def _aux(self, logits: Tensor, index: Tensor) -> Aux:
        """Weighted switch and z losses of router ``logits [N, E]`` and choices ``index``."""
        e = logits.shape[-1]
        probs = torch.softmax(logits, dim=-1).mean(dim=0)
        share = torch.bincount(index.reshape(-1), minlength=e).to(probs.dtype) / index.numel()
        z = torch.logsumexp(logits, dim=-1).square().mean()
        return {"moa_switch_loss": self.opts.switch_loss * e * (share * probs).sum(),
                "moa_z_loss": self.opts.z_loss * z}

    def project(self, x: Tensor) -> Projected:
        """``x [B, T, d]`` -> q ``[B, H, T, D]``, k, v ``[B, 1, T, D]``; ``state`` holds the
        chosen experts and gates ``[B*T, H, 1]`` for ``output``."""
        b, t, _ = x.shape
        x2 = x.reshape(-1, x.shape[-1])
        logits = selection_logits(x2, self.router)  # [N, E]
        chosen = select_experts(logits[:, None], self.n_heads, mode="softmax")
        index, gate = chosen.index.transpose(1, 2), chosen.gate.transpose(1, 2)  # [N, H, 1]
        q = expert_mm(x2, self.q_experts, index, reduce="slots")  # [N, H, D]
        q = q.view(b, t, self.n_heads, self.d_head).transpose(1, 2)
        k, v = split_heads(self.k_proj(x), 1), split_heads(self.v_proj(x), 1)
        aux = self._aux(logits, index) if self.training else {}
        return Projected(q=q, k=k, v=v, state=(index, gate), aux=aux)

    def output(self, o: Tensor, projected: Projected) -> tuple[Tensor, Aux]:
        """``o [B, H, T, D]`` -> ``y [B, T, d]``: gated sum of the chosen output experts."""
        b, h, t, dh = o.shape
        rows = o.transpose(1, 2).reshape(b * t, h, dh)
        y = expert_mm(rows, self.o_experts, *projected.state, reduce="all")
        return y.view(b, t, -1), {}


def moa_cost(s: LayerShape, opts: MoAOptions) -> Cost:
    """MACs and output floats of MoA: router, H chosen Q/O experts, shared K and V."""
    macs = (s.t * s.d * opts.n_experts
            + expert_matmul_macs(s.t, s.h, 1, s.d, s.dh, "slots", gated=False)
            + 2 * s.t * s.d * s.dh
            + expert_matmul_macs(s.t, s.h, 1, s.dh, s.d, "all"))
    return macs, 2 * s.t * s.h * s.dh + 2 * s.t * s.dh + s.t * opts.n_experts


@PROJECTIONS.register("moa", MoAOptions, cost=moa_cost)
def _moa(ctx: LayerContext, options: MoAOptions) -> MoAProjections:
    """Mixture of attention heads: routed query/output experts, one shared K and V."""
    return MoAProjections(ctx, options)
