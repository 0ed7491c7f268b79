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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from attnlab.bench.common import (
    Record,
    fill_ratios,
    fwd,
    peak_memory_mb,
    time_side_by_side,
    write_json,
)
from attnlab.config import PartSpec
from attnlab.layers import CORES, POSITIONS, LayerContext

logger = logging.getLogger(__name__)

BENCH = "bias"
BASELINE = "sdpa"
DEFAULT_SEQ_LENS = (1024, 2048, 4096, 8192)
CANDIDATES = {"sdpa": ("sdpa", False), "sdpa+bias": ("sdpa", True),
              "eager+bias": ("eager", True), "flex+bias": ("flex", True),
              "sea": ("sea", False), "sea+bias": ("sea", True)}
"""Candidate name -> (core, whether the positions' bias is added)."""


def _calls(positions: str, seq_len: int, heads: int, d_head: int, batch: int
           ) -> dict[str, Callable[[], object]]:
    """The candidates' forward calls on shared random inputs."""
    ctx = LayerContext(d_model=heads * d_head, n_heads=heads, d_head=d_head,
                       max_seq_len=seq_len)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, d_head, generator=gen) for _ in range(3))
    scheme = POSITIONS.build(PartSpec(positions), ctx=ctx).eval()
    pos, scale = torch.arange(seq_len), d_head ** -0.5

    def call(core_name: str, biased: bool) -> Callable[[], object]:
        core = CORES.build(PartSpec(core_name), ctx=ctx, dropout=0.0).eval()

        def run() -> object:
            bias = scheme.score_bias(q, k, pos, pos, scale, 1.0) if biased else None
            return core(q, k, v, scale=scale, score_bias=bias).out

        return fwd(run)

    return {name: call(core, biased) for name, (core, biased) in CANDIDATES.items()}


def run(
    *, positions: Sequence[str] = ("alibi", "xl"), seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
    heads: int = 8, d_head: int = 64, batch: int = 1, reps: int = 5,
    json_path: str | None = None,
) -> list[Record]:
    """Time every candidate side by side per scheme and length; records with ratios to
    ``sdpa`` (no bias) at the same shape."""
    for name in positions:
        if not POSITIONS.trait(name, "score_bias"):
            raise ValueError(f"positions {name!r} adds no score bias; choose from "
                             f"{POSITIONS.names(score_bias=True)}")
    records: list[Record] = []
    for scheme in positions:
        for seq_len in seq_lens:
            calls = _calls(scheme, seq_len, heads, d_head, batch)
            start = time.perf_counter()
            calls["flex+bias"]()  # compiles
            compile_s = round(time.perf_counter() - start, 2)
            logger.info("%s T=%d: flex compiled in %.1f s", scheme, seq_len, compile_s)
            timings = time_side_by_side(calls, reps)
            shape = {"positions": scheme, "seq_len": seq_len, "heads": heads,
                     "d_head": d_head, "batch": batch, "flex_compile_s": compile_s}
            for name, timing in timings.items():
                records.append(Record(BENCH, name, "fwd", shape, timing.median, timing.min,
                                      peak_memory_mb(calls[name])))
    fill_ratios(records, BASELINE)
    if json_path:
        write_json(json_path, records)
    return records
