"""SwitchHead projections (Csordas et al., NeurIPS 2024): mixture-of-experts V and O.

Each of the H real attention heads owns E value experts and E output experts. Per head, a
sigmoid gate (float32, or float64 for float64 inputs) picks the top-k of *that head's* E
experts, without renormalisation:

- ``V_j^h = sum_{e in topk(s_j^h)} s_j^h[e] x_j W_V^{h,e}`` with ``s_j^h = sigmoid(x_j W_S^h)``
  chosen by the **source** (key) token j;
- ``y_i = sum_h sum_{e in topk(d_i^h)} d_i^h[e] o_i^h W_O^{h,e}`` with
  ``d_i^h = sigmoid(x_i W_D^h)`` chosen by the **destination** (query) token i; heads and
  experts are summed, not concatenated.

Q and K are dense per head unless ``expert_q`` / ``expert_k`` (then Q reuses the destination
selection and K the source selection, or their own with ``separate_kq_selection``). q and k
are both multiplied by ``d_head ** -0.25`` (``score_scale = 1``). The layer's KV cache holds V
*after* expert mixing, so decoding needs no cached selections.

This module also holds what the other expert layers (:mod:`attnlab.layers.sigma_moe`,
:mod:`attnlab.layers.moa`) share: :func:`select_experts`, :func:`expert_mm` and
:func:`init_selection_`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.base import Aux, LayerContext, Projected, Projections, init_linear_
from attnlab.layers.cost import Cost, LayerShape
from attnlab.layers.projections import merge_heads, split_heads
from attnlab.layers.registry import PROJECTIONS
from attnlab.ops.expert_matmul import expert_matmul, expert_matmul_macs

SELECTIONS = ("sigmoid", "softmax")


@dataclasses.dataclass
class Selection:
    """Chosen experts of each (row, group): ``index`` int64 ``[N, G, k]`` in ``[0, E)``,
    ``gate`` ``[N, G, k]`` in at least float32 (differentiable in the logits)."""

    index: Tensor
    gate: Tensor


def gate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype gates are computed in: float32, or float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def selection_logits(x: Tensor, weight: Tensor) -> Tensor:
    """``x [N, d] @ weight [E', d]^T`` in :func:`gate_dtype`, with autocast off: ``[N, E']``."""
    dtype = gate_dtype(x.dtype)
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.to(dtype), weight.to(dtype))


def select_experts(
    logits: Tensor, k: int, *, mode: str = "sigmoid", dropout: float = 0.0
) -> Selection:
    """Top-k expert choice from ``logits [N, G, E]`` (cast to :func:`gate_dtype` first).

    ``mode="sigmoid"``: gates are ``sigmoid(logit)`` of the chosen experts, not renormalised
    (SwitchHead, sigma-MoE). ``mode="softmax"``: gates are the softmax over the k chosen
    logits (equal to the full softmax renormalised over the chosen experts; MoA).

    ``dropout`` > 0 (pass it only while training) is expert dropout: a Bernoulli(dropout)
    mask hides experts from the *ranking* only; the gates of the chosen experts are read from
    the unmasked scores and nothing is rescaled. If every expert of a group is hidden, the
    choice among them is arbitrary (as in the reference implementation).
    """
    if mode not in SELECTIONS:
        raise ValueError(f"selection mode must be one of {SELECTIONS}, got {mode!r}")
    logits = logits.to(gate_dtype(logits.dtype))
    ranking = logits
    if dropout > 0.0:
        hidden = torch.rand_like(logits) < dropout
        ranking = logits.masked_fill(hidden, float("-inf"))
    index = ranking.topk(k, dim=-1).indices  # sorted: slot j = j-th best expert
    chosen = logits.gather(-1, index)
    gate = torch.sigmoid(chosen) if mode == "sigmoid" else torch.softmax(chosen, dim=-1)
    return Selection(index, gate)


def expert_mm(
    x: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None = None, *, reduce: str
) -> Tensor:
    """:func:`attnlab.ops.expert_matmul` in the compute dtype (the autocast dtype if active).

    The op needs x, weight and gate in one dtype; under autocast the float32 parameters and
    gates are cast like ``F.linear`` would cast them. Shapes as in ``expert_matmul``.
    """
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    return expert_matmul(
        x.to(dtype), weight.to(dtype), sel, None if gate is None else gate.to(dtype),
        reduce=reduce,
    )


def init_selection_(weight: Tensor, fan_in: int, scale: float) -> None:
    """Selection-matrix init: N(0, (scale/sqrt(fan_in))^2), then every row (one expert's
    ``[fan_in]`` key) rescaled to the same norm, keeping the overall std. In place."""
    init_linear_(weight, fan_in, scale)
    with torch.no_grad():
        std = weight.std()
        weight.div_(weight.norm(dim=-1, keepdim=True))
        weight.mul_(std / weight.std())


def head_offsets(n_heads: int, n_experts: int, device: torch.device) -> Tensor:
    """``[H, 1]`` offsets ``h * E`` turning per-head expert ids into ids of ``[H*E, ...]``."""
    return torch.arange(n_heads, device=device)[:, None] * n_experts


@dataclasses.dataclass(frozen=True)
class SwitchHeadOptions:
    """Options of the ``switchhead`` projections.

    ``n_experts``: E experts per head (per MoE projection). ``k``: experts chosen per head
    and token among the head's own E. ``expert_q/k/v/o``: which projections are MoE (the
    paper: V and O only). ``shared_selection``: V uses the destination-side selection matrix
    of O instead of its own (paper Sec. 3.6). ``separate_kq_selection``: MoE Q/K get their own
    selection matrices instead of reusing O's / V's. ``expert_dropout``: training-only expert
    dropout (see :func:`select_experts`). ``selection``: "sigmoid" (every paper run) or
    "softmax" (softmax over the k chosen logits).

    ``n_experts == 1`` is the standalone module's special case: V is a plain dense
    projection (``expert_v`` has no effect) and, with ``expert_o``, each head's output is
    multiplied by a learned sigmoid gate ``sigmoid(x_i W_D^h)`` before its W_O.
    """

    n_experts: int = 5
    k: int = 2
    expert_q: bool = False
    expert_k: bool = False
    expert_v: bool = True
    expert_o: bool = True
    shared_selection: bool = False
    separate_kq_selection: bool = False
    expert_dropout: float = 0.0
    selection: str = "sigmoid"

    def validate(self) -> None:
        if self.n_experts < 1:
            raise ValueError(f"n_experts must be >= 1, got {self.n_experts}")
        if not 1 <= self.k <= self.n_experts:
            raise ValueError(f"k must be in [1, n_experts={self.n_experts}], got {self.k}")
        if not 0.0 <= self.expert_dropout < 1.0:
            raise ValueError(f"expert_dropout must be in [0, 1), got {self.expert_dropout}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.n_experts == 1 and (self.expert_q or self.expert_k):
            raise ValueError("expert_q/expert_k need n_experts > 1 (one expert is a dense Q/K)")
        if self.selection == "softmax" and self.k == 1 and self.n_experts > 1:
            raise ValueError("selection 'softmax' with k=1 gives a constant gate of 1; use k > 1")


class SwitchHeadProjections(Projections):
    """SwitchHead Q/K/V/O (see the module docstring); q ``[B, H, T, D]``, k and v likewise.

    Parameters: dense ``q_proj``/``k_proj`` (``nn.Linear``, no bias) or expert weights
    ``q_experts``/``k_experts`` ``[H*E, d, D]``; ``v_experts [H*E, d, D]`` (or dense
    ``v_proj``); ``o_experts [H*E, D, d]`` (or dense ``o_proj``); selection matrices
    ``sel_dst``/``sel_src`` (and ``sel_q``/``sel_k``) ``[H*E, d]``. Expert id ``h*E + e``.
    """

    def __init__(self, ctx: LayerContext, options: SwitchHeadOptions) -> None:
        super().__init__()
        self.opts = options
        h, e, d, dh = ctx.n_heads, options.n_experts, ctx.d_model, ctx.d_head
        self.n_heads, self.n_experts, self.d_head = h, e, dh
        scale = ctx.init_scale
        self.v_is_expert = options.expert_v and e > 1

        def experts(k_in: int, k_out: int, fan_in: int) -> nn.Parameter:
            weight = nn.Parameter(torch.empty(h * e, k_in, k_out))
            init_linear_(weight, fan_in, scale)
            return weight

        def dense(k_in: int, k_out: int) -> nn.Linear:
            lin = nn.Linear(k_in, k_out, bias=False)
            init_linear_(lin.weight, k_in, scale)
            return lin

        def selection() -> nn.Parameter:
            weight = nn.Parameter(torch.empty(h * e, d))
            init_selection_(weight, d, scale)
            return weight

        for name, is_expert in (("q", options.expert_q), ("k", options.expert_k),
                                ("v", self.v_is_expert)):
            if is_expert:
                setattr(self, f"{name}_experts", experts(d, dh, d))
            else:
                setattr(self, f"{name}_proj", dense(d, h * dh))
        if options.expert_o:
            self.o_experts = experts(dh, d, h * dh)  # fan-in H*d_head, not E*H*d_head
        else:
            self.o_proj = dense(h * dh, d)

        separate = options.separate_kq_selection
        need_dst = options.expert_o or (options.expert_q and not separate) or (
            self.v_is_expert and options.shared_selection)
        need_src = (self.v_is_expert and not options.shared_selection) or (
            options.expert_k and not separate)
        self.sel_dst = selection() if need_dst else None
        self.sel_src = selection() if need_src else None
        self.sel_q = selection() if options.expert_q and separate else None
        self.sel_k = selection() if options.expert_k and separate else None

        self.qk_prescale = dh**-0.25
        self.score_scale = 1.0

    def _select(self, x2: Tensor, weight: Tensor) -> Selection:
        """``x2 [N, d]`` -> per-head expert choice: ids in ``[0, E)`` and gates ``[N, H, k]``."""
        logits = selection_logits(x2, weight).view(-1, self.n_heads, self.n_experts)
        dropout = self.opts.expert_dropout if self.training else 0.0
        return select_experts(logits, self.opts.k, mode=self.opts.selection, dropout=dropout)

    def _selections(self, x2: Tensor) -> dict[str, Selection]:
        """The expert choice of each MoE projection ("q", "k", "v", "o") for ``x2 [N, d]``;
        projections that share a selection get the same object."""
        opts = self.opts
        dst = self._select(x2, self.sel_dst) if self.sel_dst is not None else None
        src = self._select(x2, self.sel_src) if self.sel_src is not None else None
        chosen = {}
        if opts.expert_q:
            chosen["q"] = self._select(x2, self.sel_q) if self.sel_q is not None else dst
        if opts.expert_k:
            chosen["k"] = self._select(x2, self.sel_k) if self.sel_k is not None else src
        if self.v_is_expert:
            chosen["v"] = dst if opts.shared_selection else src
        if opts.expert_o:
            chosen["o"] = dst
        return chosen

    def expert_choices(self, x: Tensor) -> dict[str, Selection]:
        """Which experts each token uses, for ``x [B, T, d]`` (the layer's input): per MoE
        projection ("q", "k", "v", "o"), expert ids in ``[0, E)`` of each head and their
        gates, ``[B, T, H, k]`` each (V and K are chosen by the source token, O and Q by the
        destination token)."""
        b, t, _ = x.shape
        return {name: Selection(sel.index.view(b, t, *sel.index.shape[1:]),
                                sel.gate.view(b, t, *sel.gate.shape[1:]))
                for name, sel in self._selections(x.reshape(-1, x.shape[-1])).items()}

    def _global(self, sel: Selection) -> tuple[Tensor, Tensor]:
        """(ids into the ``[H*E, ...]`` expert weights, gates), each ``[N, H, k]``."""
        return sel.index + head_offsets(self.n_heads, self.n_experts, sel.index.device), sel.gate

    def _project(
        self, x: Tensor, x2: Tensor, name: str, sel: Selection | None
    ) -> Tensor:
        """One of q/k/v for ``x [B, T, d]`` (``x2`` its ``[N, d]`` view) -> ``[B, H, T, D]``."""
        if sel is None:
            return split_heads(getattr(self, f"{name}_proj")(x), self.n_heads)
        weight = getattr(self, f"{name}_experts")
        out = expert_mm(x2, weight, *self._global(sel), reduce="slots")  # [N, H, D]
        b, t, _ = x.shape
        return out.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def project(self, x: Tensor) -> Projected:
        """``x [B, T, d]`` -> q, k, v ``[B, H, T, D]`` (q and k scaled by ``D**-0.25``).

        ``state`` is the destination selection (ids, gates ``[B*T, H, k]``) for ``output``.
        """
        x2 = x.reshape(-1, x.shape[-1])
        chosen = self._selections(x2)
        q = self._project(x, x2, "q", chosen.get("q")) * self.qk_prescale
        k = self._project(x, x2, "k", chosen.get("k")) * self.qk_prescale
        v = self._project(x, x2, "v", chosen.get("v"))
        return Projected(q=q, k=k, v=v, state=chosen.get("o"))

    def output(self, o: Tensor, projected: Projected) -> tuple[Tensor, Aux]:
        """``o [B, H, T, D]`` -> ``y [B, T, d]``: gated sum over heads and chosen O experts."""
        if not self.opts.expert_o:
            return self.o_proj(merge_heads(o)), {}
        b, h, t, dh = o.shape
        rows = o.transpose(1, 2).reshape(b * t, h, dh)
        y = expert_mm(rows, self.o_experts, *self._global(projected.state), reduce="all")
        return y.view(b, t, -1), {}


def n_selections(opts: SwitchHeadOptions) -> int:
    """How many ``[H*E, d]`` selection matrices SwitchHead projections with ``opts`` build."""
    separate = opts.separate_kq_selection
    v_expert = opts.expert_v and opts.n_experts > 1
    return sum((
        opts.expert_o or (opts.expert_q and not separate) or (v_expert and opts.shared_selection),
        (v_expert and not opts.shared_selection) or (opts.expert_k and not separate),
        opts.expert_q and separate,
        opts.expert_k and separate,
    ))


def switchhead_cost(s: LayerShape, opts: SwitchHeadOptions) -> Cost:
    """MACs and output floats of SwitchHead Q/K/V/O, selections included; expert matmuls at
    their useful MACs (the dense all-experts backend's extra work is not credited)."""
    e, k = opts.n_experts, opts.k
    v_expert = opts.expert_v and e > 1
    dense_in = s.t * s.d * s.h * s.dh
    expert_in = expert_matmul_macs(s.t, s.h, k, s.d, s.dh, "slots")
    macs = sum(expert_in if flag else dense_in for flag in (opts.expert_q, opts.expert_k, v_expert))
    macs += expert_matmul_macs(s.t, s.h, k, s.dh, s.d, "all") if opts.expert_o else dense_in
    n_sel = n_selections(opts)
    macs += n_sel * s.t * s.d * s.h * e
    return macs, 4 * s.t * s.h * s.dh + n_sel * s.t * s.h * e


@PROJECTIONS.register("switchhead", SwitchHeadOptions, cost=switchhead_cost)
def _switchhead(ctx: LayerContext, options: SwitchHeadOptions) -> SwitchHeadProjections:
    """SwitchHead: per-head mixture-of-experts V and O projections (sigmoid top-k gates)."""
    return SwitchHeadProjections(ctx, options)

