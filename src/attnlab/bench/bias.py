"""``attnlab bench bias``: what a position bias costs each core, side by side.

Per position scheme with a score bias (``alibi``, ``xl``) and length, one causal attention
call ``[batch, heads, T, d_head]`` (forward, inference) through:

* ``sdpa``: no bias at all: the fused causal kernel, the cost of attention itself (baseline);
* ``sdpa+bias``: SDPA with the bias materialised as a dense ``[B, H, T, T]`` additive mask;
* ``eager+bias``: the explicit reference (scores, bias, softmax, all materialised);
* ``flex+bias``: the ``flex`` core, the bias as FlexAttention's ``score_mod`` (compiled);
* ``sea``, ``sea+bias``: the ``sea`` core (default options, untrained estimator) without and
  with the bias, which it adds at its selected keys only (ALiBi inside its native kernel;
  other biases move it onto the PyTorch sparse path).

Each candidate builds its own bias from q and k in every call (Transformer-XL's ``q . R``
table is part of its cost). The first ``flex`` call at each length compiles the kernel; its
seconds are recorded as ``compile_s`` in the shape and are not in the timings.

A ``+bias`` figure is only reported for a bias that was applied: a scheme must return a bias
(one that declares the ``score_bias`` trait and returns None is refused before any timing),
and each ``+bias`` candidate's untimed first call must differ from the same core's output
without it (``sdpa``'s for cores without an unbiased candidate); otherwise the run stops with
``ValueError`` before anything is written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from attnlab.config import PartSpec
from attnlab.layers import CORES, POSITIONS, LayerContext
from attnlab.results import (
    Record,
    fill_ratios,
    fwd,
    peak_memory_mb,
    time_side_by_side,
    write_json,
)

logger = logging.getLogger(__name__)

BENCH = "bias"
BASELINE = "sdpa"
DEFAULT_SEQ_LENS = (1024, 2048, 4096, 8192)
CANDIDATES = {"sdpa": ("sdpa", False), "sdpa+bias": ("sdpa", True),
              "eager+bias": ("eager", True), "flex+bias": ("flex", True),
              "sea": ("sea", False), "sea+bias": ("sea", True)}
"""Candidate name -> (core, whether the positions' bias is added)."""


MIN_CHANGE = 1e-4
"""Largest absolute output difference, relative to the output's largest value, below which a
bias counts as not applied (float32 reordering differs by ~1e-6)."""


def check_bias(positions: str, heads: int, d_head: int, tokens: int = 8) -> None:
    """``ValueError`` unless ``positions`` declares the ``score_bias`` trait and its scheme
    returns a bias (on ``tokens`` random tokens)."""
    if not POSITIONS.trait(positions, "score_bias"):
        raise ValueError(f"positions {positions!r} adds no score bias; choose from "
                         f"{POSITIONS.names(score_bias=True)}")
    ctx = LayerContext(d_model=heads * d_head, n_heads=heads, d_head=d_head,
                       max_seq_len=tokens)
    scheme = POSITIONS.build(PartSpec(positions), ctx=ctx).eval()
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, heads, tokens, d_head, generator=gen) for _ in range(2))
    pos = torch.arange(tokens)
    if scheme.score_bias(q, k, pos, pos, d_head ** -0.5, 1.0) is None:
        raise ValueError(f"positions {positions!r} declares the score_bias trait but returns no "
                         "bias: its '+bias' candidates would time attention without one")


def _forwards(positions: str, seq_len: int, heads: int, d_head: int, batch: int
              ) -> dict[str, Callable[[], Tensor]]:
    """The candidates' forwards ``-> [batch, heads, seq_len, d_head]`` on shared random
    inputs."""
    ctx = LayerContext(d_model=heads * d_head, n_heads=heads, d_head=d_head,
                       max_seq_len=seq_len)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, d_head, generator=gen) for _ in range(3))
    scheme = POSITIONS.build(PartSpec(positions), ctx=ctx).eval()
    pos, scale = torch.arange(seq_len), d_head ** -0.5

    def forward(core_name: str, biased: bool) -> Callable[[], Tensor]:
        core = CORES.build(PartSpec(core_name), ctx=ctx, dropout=0.0).eval()

        def run() -> Tensor:
            bias = scheme.score_bias(q, k, pos, pos, scale, 1.0) if biased else None
            return core(q, k, v, scale=scale, score_bias=bias).out

        return run

    return {name: forward(core, biased) for name, (core, biased) in CANDIDATES.items()}


def check_applied(outputs: Mapping[str, Tensor], positions: str) -> None:
    """``ValueError`` naming the first ``+bias`` candidate whose output (``[B, H, T, D]``)
    equals the unbiased one of its core (``sdpa``'s where the core has none): its bias was not
    applied, so its time is not a biased attention's."""
    for name, (core, biased) in CANDIDATES.items():
        if not biased:
            continue
        ref = outputs[core if (core, False) in CANDIDATES.values() else BASELINE]
        change = (outputs[name] - ref).abs().max() / ref.abs().max().clamp_min(1e-30)
        if change < MIN_CHANGE:
            raise ValueError(f"{name}: the {core} core gave the same output with the "
                             f"{positions!r} bias as without it (relative change "
                             f"{change:.1e}): the bias was not applied, so a '+bias' time "
                             "would not be one")


def run(
    *, positions: Sequence[str] = ("alibi", "xl"), seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
    heads: int = 8, d_head: int = 64, batch: int = 1, reps: int = 5,
    json_path: str | None = None,
) -> list[Record]:
    """Time every candidate side by side per scheme and length; records with ratios to
    ``sdpa`` (no bias) at the same shape."""
    for name in positions:
        check_bias(name, heads, d_head)
    records: list[Record] = []
    for scheme in positions:
        for seq_len in seq_lens:
            forwards = _forwards(scheme, seq_len, heads, d_head, batch)
            with torch.no_grad():  # each candidate's warmup call, checked
                start = time.perf_counter()
                outputs = {"flex+bias": forwards["flex+bias"]()}  # compiles
                compile_s = round(time.perf_counter() - start, 2)
                outputs.update({n: f() for n, f in forwards.items() if n not in outputs})
            check_applied(outputs, scheme)
            del outputs
            logger.info("%s T=%d: flex compiled in %.1f s", scheme, seq_len, compile_s)
            calls = {name: fwd(forward) for name, forward in forwards.items()}
            timings = time_side_by_side(calls, reps, warmup=0)
            shape = {"positions": scheme, "seq_len": seq_len, "heads": heads,
                     "d_head": d_head, "batch": batch, "flex_compile_s": compile_s}
            for name, timing in timings.items():
                records.append(Record(BENCH, name, "fwd", shape, timing.median, timing.min,
                                      peak_memory_mb(calls[name])))
    fill_ratios(records, BASELINE)
    if json_path:
        write_json(json_path, records)
    return records
