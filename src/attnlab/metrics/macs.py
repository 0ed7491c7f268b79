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
  work (RoPE, softmax, gates, masks) is not counted.

:func:`attention_cost` applies either convention to a :class:`RunConfig` and adds the
parameter count and whole-model MACs per token. Results are plain ``int`` dicts (JSON-able).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from attnlab.ops.expert_matmul import expert_matmul_macs
from attnlab.train.config import RunConfig

PAPER_KINDS = ("dense", "switchhead", "moa")
CONVENTIONS = ("paper", "exact")
SOFTMAX_CORES = ("sdpa", "eager")
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


@dataclasses.dataclass(frozen=True)
class _Shape:
    """The sizes of one attention layer's forward: T new tokens over ``tk`` keys."""

    d: int
    h: int
    dh: int
    t: int
    tk: int
    causal: bool = True


def _dense_proj(s: _Shape, n_kv_heads: int | None) -> tuple[int, int]:
    """MACs and output floats of dense Q/K/V/O (grouped-query when ``n_kv_heads`` < H)."""
    hk = n_kv_heads or s.h
    macs = s.t * s.d * s.dh * (2 * s.h + 2 * hk)
    return macs, s.t * s.dh * (2 * s.h + 2 * hk)


def _n_selections(opts: Any) -> int:
    """How many ``[H*E, d]`` selection matrices SwitchHead projections with ``opts`` build."""
    separate = opts.separate_kq_selection
    v_expert = opts.expert_v and opts.n_experts > 1
    return sum((
        opts.expert_o or (opts.expert_q and not separate) or (v_expert and opts.shared_selection),
        (v_expert and not opts.shared_selection) or (opts.expert_k and not separate),
        opts.expert_q and separate,
        opts.expert_k and separate,
    ))


def _switchhead_proj(s: _Shape, opts: Any) -> tuple[int, int]:
    """MACs and output floats of SwitchHead Q/K/V/O, selections included."""
    e, k = opts.n_experts, opts.k
    v_expert = opts.expert_v and e > 1
    dense_in = s.t * s.d * s.h * s.dh
    expert_in = expert_matmul_macs(s.t, s.h, k, s.d, s.dh, "slots")
    macs = sum(expert_in if flag else dense_in for flag in (opts.expert_q, opts.expert_k, v_expert))
    macs += expert_matmul_macs(s.t, s.h, k, s.dh, s.d, "all") if opts.expert_o else dense_in
    n_sel = _n_selections(opts)
    macs += n_sel * s.t * s.d * s.h * e
    return macs, 4 * s.t * s.h * s.dh + n_sel * s.t * s.h * e


def _moa_proj(s: _Shape, opts: Any) -> tuple[int, int]:
    """MACs and output floats of MoA: router, H chosen Q/O experts, shared K and V."""
    macs = (s.t * s.d * opts.n_experts
            + expert_matmul_macs(s.t, s.h, 1, s.d, s.dh, "slots", gated=False)
            + 2 * s.t * s.d * s.dh
            + expert_matmul_macs(s.t, s.h, 1, s.dh, s.d, "all"))
    return macs, 2 * s.t * s.h * s.dh + 2 * s.t * s.dh + s.t * opts.n_experts


def _xl_positions(s: _Shape, content_bias: bool) -> tuple[int, int]:
    """MACs and floats of ``XLRelativePositions.score_bias`` (projection, q.r, u.k, bias)."""
    n_dist = s.tk if s.causal else s.tk + s.t - 1
    macs = n_dist * s.d * s.h * s.dh + s.h * s.t * n_dist * s.dh
    if content_bias:
        macs += s.h * s.tk * s.dh
    return macs, n_dist * s.h * s.dh + s.h * s.t * n_dist + s.h * s.t * s.tk


def exact_attention_cost(
    projections: Any, positions: Any, *, d_model: int, n_heads: int, d_head: int,
    seq_len: int, memory_len: int, causal: bool = True,
) -> dict[str, int]:
    """Forward MACs and activation floats of one attnlab attention layer (module docstring).

    ``projections`` / ``positions`` are the layer's :class:`PartSpec` s (dense, switchhead
    or moa; none, learned, rope, xl or alibi). Memory floats count the main tensors the forward
    materialises for the new tokens: q/k/v/o, selection logits, the ``T x Tk`` scores and
    probabilities, and for XL the position keys, ``q . r`` table and gathered bias.
    """
    from attnlab.layers import POSITIONS, PROJECTIONS

    s = _Shape(d_model, n_heads, d_head, seq_len, seq_len + memory_len, causal)
    opts = PROJECTIONS.options(projections)
    if projections.name == "dense":
        macs, memory = _dense_proj(s, opts.n_kv_heads)
    elif projections.name == "switchhead":
        macs, memory = _switchhead_proj(s, opts)
    elif projections.name == "moa":
        macs, memory = _moa_proj(s, opts)
    else:
        raise ValueError(f"no MAC accounting for projections {projections.name!r}")
    if positions.name == "xl":
        pos_macs, pos_memory = _xl_positions(s, POSITIONS.options(positions).content_bias)
        macs, memory = macs + pos_macs, memory + pos_memory
    elif positions.name == "alibi":  # a dense [H, T, Tk] bias, no multiplications
        memory += s.h * s.t * s.tk
    elif positions.name not in ("none", "learned", "rope"):
        raise ValueError(f"no MAC accounting for positions {positions.name!r}")
    macs += 2 * s.h * s.t * s.tk * s.dh
    memory += 2 * s.h * s.t * s.tk
    return {"macs": macs, "memory_floats": memory}


def _paper_from_config(cfg: RunConfig) -> dict[str, int]:
    """:func:`_paper_cost` for a run config: ``T(1+C)`` = ``seq_len + memory_len``; ``n_exp``
    and ``n_sel`` from the SwitchHead options (2 and 2 for the paper's V/O experts); MoA's
    ``k`` is the inferred one; positions other than "xl" have no position term."""
    model, att = cfg.model, cfg.model.attention
    kind = att.projections.name
    if kind not in PAPER_KINDS:
        raise ValueError(f"the paper formulas cover {PAPER_KINDS}, not projections {kind!r}")
    from attnlab.layers import PROJECTIONS

    opts = PROJECTIONS.options(att.projections)
    n_experts = k = None
    n_exp = n_sel = 2
    if kind == "switchhead":
        n_experts, k = opts.n_experts, opts.k
        v_expert = opts.expert_v and n_experts > 1
        n_exp = sum((opts.expert_q, opts.expert_k, v_expert, opts.expert_o))
        n_sel = _n_selections(opts)
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
    """Forward MACs of one layer's MLP for one token (useful MACs for sigma-MoE)."""
    from attnlab.layers import MLPS

    model = cfg.model
    opts = MLPS.options(model.mlp)
    if model.mlp.name == "dense":
        return 2 * model.d_model * model.d_ff
    if model.mlp.name == "swiglu":  # gate, up and down
        return 3 * model.d_model * model.d_ff
    if model.mlp.name == "sigma_moe":
        size = opts.expert_size or model.d_ff // opts.n_experts
        return (model.d_model * opts.n_experts
                + expert_matmul_macs(1, 1, opts.k, model.d_model, size, "none")
                + expert_matmul_macs(1, opts.k, 1, size, model.d_model, "all"))
    raise ValueError(f"no MAC accounting for mlp {model.mlp.name!r}")


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
    core = model.attention.core.name
    if core not in SOFTMAX_CORES:
        raise ValueError(f"MAC accounting covers the cores {SOFTMAX_CORES}, not {core!r}")
    if convention == "paper":
        cost = _paper_from_config(cfg)
    else:
        cost = exact_attention_cost(
            model.attention.projections, model.attention.positions, d_model=model.d_model,
            n_heads=model.attention.n_heads, d_head=model.d_head, seq_len=cfg.train.seq_len,
            memory_len=model.memory_len,
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
