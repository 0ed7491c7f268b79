"""SEA's inference grid after distillation (the authors' Table A.6): the student's quality at
every dynamic-k x query-skip setting, with the latency and peak memory of each setting beside
it, measured side by side with the dense teacher in one run.

Quality: each setting on the same first ``eval_tokens`` held-out tokens. Cost: one forward of
one held-out sequence of the distillation context per call, every setting and the teacher
timed round-robin (``grid_reps`` rounds, medians) and its peak memory taken from one call
(:func:`attnlab.results.peak_memory_mb`: the allocator's peak on CUDA, the profiler's
allocation trace on CPU); ratios are against the teacher measured in the same run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from attnlab.distill.config import DistillConfig
from attnlab.distill.pair import DistillPair
from attnlab.results import fwd, peak_memory_mb, time_side_by_side

logger = logging.getLogger(__name__)

TEACHER = "teacher"


def _label(k: int, skip: int) -> str:
    return f"k={k} query_skip={skip}"


def _settings(pair: DistillPair, d: DistillConfig) -> list[tuple[int, int]]:
    trained_k = pair.sea_cores()[0].k
    ks = d.dynamic_k or sorted({max(1, trained_k // 2), trained_k, 2 * trained_k})
    return [(k, skip) for k in ks for skip in d.query_skip]


def _set(pair: DistillPair, k: int, skip: int) -> None:
    for core in pair.sea_cores():
        core.set_inference(k=k, query_skip=skip)


def _costs(pair: DistillPair, settings: list[tuple[int, int]], reps: int,
           device: torch.device) -> dict[str, dict[str, float]]:
    """``{label: {"latency_ms", "peak_mb"}}`` of the teacher and every setting, side by side."""
    tokens = pair.corpus.valid[: pair.seq_len].astype(np.int64)
    x = torch.from_numpy(tokens).unsqueeze(0).to(device)

    def student_at(k: int, skip: int) -> Callable[[], None]:
        def call() -> None:
            _set(pair, k, skip)
            pair.infer(pair.student, x)

        return fwd(call)

    calls = {TEACHER: fwd(lambda: pair.infer(pair.teacher, x)),
             **{_label(k, skip): student_at(k, skip) for k, skip in settings}}
    timings = time_side_by_side(calls, reps=reps, device=device)
    return {name: {"latency_ms": timings[name].median,
                   "peak_mb": peak_memory_mb(call, device)} for name, call in calls.items()}


def inference_grid(pair: DistillPair, d: DistillConfig,
                   device: torch.device) -> tuple[list[dict], dict[str, Any] | None]:
    """The grid (one entry per setting: ``k``, ``query_skip``, the quality metrics and, with
    ``grid_reps``, ``latency_ms``, ``peak_mb`` and their ratios to the teacher) and the
    teacher's cost (None without timing); SEA students only (``([], None)`` otherwise)."""
    cores = pair.sea_cores()
    if not cores:
        return [], None
    trained = cores[0].k, cores[0].query_skip
    settings = _settings(pair, d)
    grid = []
    for k, skip in settings:
        _set(pair, k, skip)
        result = pair.evaluate_student(pair.seq_len, d.eval_tokens)
        grid.append({"k": k, "query_skip": skip, **result})
        logger.info("student %s: %s", _label(k, skip),
                    ", ".join(f"{name} {value:.4g}" for name, value in result.items()))
    teacher = None
    if d.grid_reps:
        costs = _costs(pair, settings, d.grid_reps, device)
        teacher = {"seq_len": pair.seq_len, "batch": 1, "reps": d.grid_reps, **costs[TEACHER]}
        for cell in grid:
            cost = costs[_label(cell["k"], cell["query_skip"])]
            cell.update(cost, latency_x_teacher=cost["latency_ms"] / teacher["latency_ms"],
                        peak_x_teacher=cost["peak_mb"] / max(teacher["peak_mb"], 1e-9))
    _set(pair, *trained)
    return grid, teacher

