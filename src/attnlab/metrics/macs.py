"""MACs and memory of one attention layer: the SwitchHead paper's formulas, or what runs.

Two conventions, both per layer and per sequence of ``T`` new tokens:

* ``"paper"`` (:func:`paper_attention_cost`): the formulas of the SwitchHead paper (App. A.2,
  ``paper/common.py``) exactly, quirks included: SwitchHead's XL position term lacks the
  ``(1 + C)`` factor of the baseline's and its selection cost lacks the ``H`` factor. Memory
  chunks' K/V are assumed cached. The paper gives no MoA memory formula and no MoA
  ``E``/``d_head``; see :data:`MOA_INFERRED`.
* ``"exact"`` (:func:`exact_attention_cost`): the matmuls attnlab's code executes for one
  layer's forward on ``T`` tokens with ``memory_len`` cached keys (``Tk = T + memory_len``):
  Q/K/V/O projections of the new tokens only (cached K/V are not re-projected); expert
  matmuls at their useful MACs (:func:`attnlab.ops.expert_matmul.expert_matmul_macs`; the
  dense all-experts backend does ``E / (G * k)`` times more, which is not credited);
  selection/router matmuls; the XL position projection of the distances ``0 .. Tk - 1``
  (``-(T - 1) .. Tk - 1`` if not causal) and its ``q . r`` einsum (plus the ``u . k`` term
  when ``content_bias``); and ``q k^T`` and ``attn v`` over the **full** ``T x Tk``
  rectangle, as dense SDPA / the eager core compute them (no causal halving). Element-wise
  work (RoPE, softmax, gates, masks) is not counted. Each part declares its own formula at
  registration (the ``cost`` trait, :mod:`attnlab.layers.cost`), so a part registered from a
  plugin is counted when it declares one and refused, by name, when it does not.

:func:`attention_cost` applies either convention to a :class:`RunConfig` and adds the
parameter count and whole-model MACs per token. Results are plain ``int`` dicts (JSON-able).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from attnlab.config import PartSpec
from attnlab.layers import CORES, MLPS, POSITIONS, PROJECTIONS, Registry
from attnlab.layers.cost import Cost, LayerShape
from attnlab.layers.switchhead import n_selections
from attnlab.train.config import RunConfig

PAPER_KINDS = ("dense", "switchhead", "moa")
CONVENTIONS = ("paper", "exact")
DEFAULT_VOCAB = 256

MOA_INFERRED: dict[str, Any] = {
    "k": 2,
    "47M": {"n_experts": 10, "d_head": 88},
    "262M": {"n_experts": 16, "d_head": 144},
    "memory": "2*H*T^2*(1+C) + 2*H*d_h*T + E*T + 2*T*d_h*(1+C)",
}
"""MoA settings INFERRED (not in the paper or its repo) by grid search against Table 1.

The MoA MAC formula has an ``H*k*T*d_h`` term with an unexplained ``k``: over ``k`` in 1..8
(and ``k = H``), ``d_head`` in 8..599 and ``E`` in ``H..256``, the 47M row (H2/4/6/8:
140.1M/223.5M/306.8M/390.2M) is matched only by ``k=2, E=10, d_head=88``. The 262M row
(1.1G/1.7G/2.9G/4.1G at one decimal) and its memory figures allow, with ``k=2``, any
``d_head`` in 141..146 with a range of ``E``;
``d_head=144, E=16`` (with ``k=2``) is one choice. The memory formula above (no published
one) reproduces all eight MoA memory figures with these settings."""


def _paper_cost(
    kind: str,
    *,
    d: int,
    h: int,
    dh: int,
    t: int,
    window: int,
    n_experts: int | None,
    k: int | None,
    xl: bool,
    n_exp: int,
    n_sel: int,
    baseline_position_term: bool,
) -> dict[str, int]:
    """The paper formulas with ``window = T * (1 + C)`` key positions."""
    if kind not in PAPER_KINDS:
        raise ValueError(f"kind must be one of {PAPER_KINDS}, got {kind!r}")
    scores = 2 * h * dh * t * window  # QK^T and AV
    if kind == "dense":
        macs = scores + 4 * d * h * dh * t + (2 * h * d * dh * window if xl else 0)
        memory = 2 * h * t * window + 4 * h * dh * t + (2 * h * dh * window if xl else 0)
        return {"macs": macs, "memory_floats": memory}
    if n_experts is None or k is None:
        raise ValueError(f"kind {kind!r} needs n_experts and k")
    e = n_experts
    if kind == "switchhead":
        pos_len = window if baseline_position_term else t
        macs = (scores + (n_exp * k + 4 - n_exp) * d * h * dh * t + n_exp * h * k * t * dh
                + n_sel * e * d * window + (2 * h * d * dh * pos_len if xl else 0))
        memory = (2 * h * t * window + 4 * h * dh * t + n_sel * e * window
                  + (2 * h * dh * pos_len if xl else 0))
        return {"macs": macs, "memory_floats": memory}
    macs = (scores + (2 * h + 2) * d * dh * t + h * k * t * dh + e * d * t
            + (2 * d * dh * window if xl else 0))
    memory = 2 * h * t * window + 2 * h * dh * t + e * t + (2 * dh * window if xl else 0)
    return {"macs": macs, "memory_floats": memory}


def paper_attention_cost(
    kind: str,
    *,
    d_model: int,
    n_heads: int,
    d_head: int,
    seq_len: int,
    mem_chunks: int,
    n_experts: int | None = None,
    k: int | None = None,
    positions: str = "xl",
    n_exp: int = 2,
    n_sel: int = 2,
    baseline_position_term: bool = False,
) -> dict[str, int]:
    """MACs and memory floats of one attention layer on one sequence, by the paper's formulas.

    ``kind``: "dense", "switchhead" or "moa"; ``seq_len`` is T, ``mem_chunks`` C (1 for the
    paper's XL runs, 0 for RoPE); ``positions``: "xl" (with the position-projection term) or
    "rope" (without). ``n_exp`` (MoE projections, V and O) and ``n_sel`` (selection matrices)
    are the paper's constants for SwitchHead. MoA needs ``k`` (see :data:`MOA_INFERRED`);
    its memory formula is inferred. ``baseline_position_term`` counts SwitchHead's XL position
    term over all ``T(1+C)`` positions like the baseline's (the paper does not: 170.4M
    instead of 202.4M for WT103 47M).
    """
    if positions not in ("xl", "rope"):
        raise ValueError(f"positions must be 'xl' or 'rope', got {positions!r}")
    if mem_chunks < 0:
        raise ValueError(f"mem_chunks must be >= 0, got {mem_chunks}")
    return _paper_cost(
        kind, d=d_model, h=n_heads, dh=d_head, t=seq_len, window=seq_len * (1 + mem_chunks),
        n_experts=n_experts, k=k, xl=positions == "xl", n_exp=n_exp, n_sel=n_sel,
        baseline_position_term=baseline_position_term,
    )


def declared_cost(registry: Registry[Any], spec: PartSpec, shape: LayerShape) -> Cost:
    """The ``cost`` a part declared at registration (:mod:`attnlab.layers.cost`) at
    ``shape``; ``ValueError`` naming the part when it declared none."""
    cost = registry.trait(spec.name, "cost")
    if cost is None:
        kinds = registry.kind if registry.kind.endswith("s") else f"{registry.kind}s"
        declared = [n for n in registry.names() if registry.trait(n, "cost") is not None]
        raise ValueError(
            f"no MAC accounting for {registry.kind} {spec.name!r}: the {kinds} that declare "
            f"one are {declared} (a part declares its formula when registered: "
            "register(..., cost=...), see attnlab.layers.cost)")
    return cost(shape, registry.options(spec))


def exact_attention_cost(
    projections: PartSpec, positions: PartSpec, *, d_model: int, n_heads: int, d_head: int,
    seq_len: int, memory_len: int, causal: bool = True, core: PartSpec | None = None,
) -> dict[str, int]:
    """Forward MACs and activation floats of one attnlab attention layer (module docstring):
    the sum of what its projections, positions and core (default ``eager``: the full score
    rectangle) declare as their ``cost``; ``ValueError`` for a part that declares none."""
    shape = LayerShape(d_model, n_heads, d_head, seq_len, seq_len + memory_len, causal)
    parts = ((PROJECTIONS, projections), (POSITIONS, positions),
             (CORES, core or PartSpec("eager")))
    costs = [declared_cost(registry, spec, shape) for registry, spec in parts]
    return {"macs": sum(c[0] for c in costs), "memory_floats": sum(c[1] for c in costs)}


def counted(projections: PartSpec, positions: PartSpec, core: PartSpec) -> bool:
    """Whether every part of the layer declares a ``cost`` (so
    :func:`exact_attention_cost` counts it)."""
    parts = ((PROJECTIONS, projections), (POSITIONS, positions), (CORES, core))
    return all(registry.trait(spec.name, "cost") is not None for registry, spec in parts)


def _paper_from_config(cfg: RunConfig) -> dict[str, int]:
    """:func:`_paper_cost` for a run config: ``T(1+C)`` = ``seq_len + memory_len``; ``n_exp``
    and ``n_sel`` from the SwitchHead options (2 and 2 for the paper's V/O experts); MoA's
    ``k`` is the inferred one; positions other than "xl" have no position term."""
    model, att = cfg.model, cfg.model.attention
    kind = att.projections.name
    if kind not in PAPER_KINDS:
        raise ValueError(f"the paper formulas cover {PAPER_KINDS}, not projections {kind!r}")
    opts = PROJECTIONS.options(att.projections)
    n_experts = k = None
    n_exp = n_sel = 2
    if kind == "switchhead":
        n_experts, k = opts.n_experts, opts.k
        v_expert = opts.expert_v and n_experts > 1
        n_exp = sum((opts.expert_q, opts.expert_k, v_expert, opts.expert_o))
        n_sel = n_selections(opts)
    elif kind == "moa":
        n_experts, k = opts.n_experts, MOA_INFERRED["k"]
    elif opts.n_kv_heads not in (None, att.n_heads):
        raise ValueError("the paper formulas assume multi-head attention, not grouped-query")
    t = cfg.train.seq_len
    return _paper_cost(
        kind, d=model.d_model, h=att.n_heads, dh=model.d_head, t=t, window=t + model.memory_len,
        n_experts=n_experts, k=k, xl=att.positions.name == "xl", n_exp=n_exp, n_sel=n_sel,
        baseline_position_term=False,
    )


def _mlp_macs_per_token(cfg: RunConfig) -> int:
    """Forward MACs of one layer's MLP for one token, as the MLP declares them."""
    model = cfg.model
    macs = MLPS.trait(model.mlp.name, "macs_per_token")
    if macs is None:
        raise ValueError(f"no MAC accounting for mlp {model.mlp.name!r}: it declares no "
                         "macs_per_token (MLPS.register(..., macs_per_token=...))")
    return macs(model.d_model, model.d_ff, MLPS.options(model.mlp))


def count_params(cfg: RunConfig) -> int:
    """Parameters of ``DecoderLM(cfg.model)`` (vocabulary 256 when unset), built on meta."""
    from attnlab.models.lm import DecoderLM

    model_cfg = cfg.model
    if model_cfg.vocab_size is None:
        model_cfg = dataclasses.replace(model_cfg, vocab_size=DEFAULT_VOCAB)
    with torch.device("meta"):
        return DecoderLM(model_cfg).num_params()


def attention_cost(cfg: RunConfig, convention: str = "exact") -> dict[str, Any]:
    """Attention MACs / memory floats per layer per sequence, params and model MACs per token.

    ``model_macs_per_token`` = ``n_layers * (attention_macs / T + MLP MACs per token)`` plus
    the LM head (``d_model * vocab``, vocab 256 when unset), rounded down; under "paper"
    the attention part is the paper's formula, under "exact" what attnlab runs. Embedding
    look-ups, norms and element-wise work are not counted.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    model = cfg.model
    if convention == "paper":
        cost = _paper_from_config(cfg)
    else:
        cost = exact_attention_cost(
            model.attention.projections, model.attention.positions, d_model=model.d_model,
            n_heads=model.attention.n_heads, d_head=model.d_head, seq_len=cfg.train.seq_len,
            memory_len=model.memory_len, core=model.attention.core,
        )
    t = cfg.train.seq_len
    vocab = model.vocab_size or DEFAULT_VOCAB
    per_token = (model.n_layers * (cost["macs"] + t * _mlp_macs_per_token(cfg)) // t
                 + model.d_model * vocab)
    return {
        "convention": convention,
        "attention_macs": cost["macs"],
        "attention_memory_floats": cost["memory_floats"],
        "params": count_params(cfg),
        "model_macs_per_token": per_token,
    }
