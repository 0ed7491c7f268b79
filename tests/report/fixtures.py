"""Tiny fake inputs of a report: run folders, a distilled student, bench JSON files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from attnlab.results import Record, fill_ratios, write_json


def fake_run(path: Path, curve: Sequence[tuple[int, float]], metric: str = "eval_bpc",
             params: int = 1000, tokens_per_step: int = 64, tokens_per_s: float = 640.0) -> Path:
    """A finished ``attnlab train`` run: training records every 10 steps (logged at
    ``tokens_per_s``) and the eval ``curve`` ``[(step, value)]``."""
    path.mkdir(parents=True)
    last = curve[-1][0]
    (path / "summary.json").write_text(json.dumps({
        "params": params, "steps": last, "tokens": last * tokens_per_step, metric: curve[-1][1],
        "train_wall_s": last * tokens_per_step / tokens_per_s}))
    rows = [{"step": s, "loss": 3.0 - s / 1000, "tokens": s * tokens_per_step,
             "tokens_per_s": tokens_per_s} for s in range(10, last + 1, 10)]
    rows += [{"step": s, metric: v, "eval_tokens": 100} for s, v in curve]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def fake_student(path: Path, teacher: Path, grid: bool = True, core: str = "sea",
                 curve: Sequence[tuple[int, float]] = ((2, 7.0), (4, 6.5), (6, 6.05)),
                 costs: bool = False) -> Path:
    """A finished ``attnlab distill`` run of a student (SEA: k 4, query skips 1 and 2) with
    held-out perplexity ``curve`` ``[(step, ppl)]`` and training records every 2 steps;
    ``costs``: its grid has each setting's time and memory (teacher: 10 ms, 4 MiB; the
    setting of k and skip s: k + 1/s ms, k / 4 MiB)."""
    path.mkdir(parents=True)
    (path / "distill.yaml").write_text("distill: {}\n")
    inference = [{"k": k, "query_skip": s, "ppl": 5.0 + 4 / k + s / 10, "bpc": 2.0 + 1 / k}
                 for k in (2, 4, 8) for s in (1, 2)] if grid else []
    extra = {}
    if costs:
        for cell in inference:
            ms, mb = cell["k"] + 1 / cell["query_skip"], cell["k"] / 4
            cell.update(latency_ms=ms, peak_mb=mb, latency_x_teacher=ms / 10,
                        peak_x_teacher=mb / 4)
        extra["inference_teacher"] = {"seq_len": 32, "batch": 1, "reps": 5, "latency_ms": 10.0,
                                      "peak_mb": 4.0}
    (path / "summary.json").write_text(json.dumps({
        "teacher": str(teacher), "student_attention": {"name": core, "k": 4}, "steps": 6,
        "tokens": 384, "seq_len": 32, "teacher_ppl": 5.5, "student_ppl": 6.05,
        "teacher_bpc": 2.4, "student_bpc": 2.5, "ppl_ratio": 1.1, "inference": inference,
        **extra}))
    rows = [{"step": s, "loss": 4.0 - s / 10, "tokens": 64 * s, "tokens_per_s": 320.0}
            for s in (2, 4, 6)]
    rows += [{"step": s, "eval_ppl": v, "eval_bpc": 2.5} for s, v in curve]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def fake_step_times(path: Path, ms: dict[str, float]) -> Path:
    """A ``bench train`` JSON file: one training step per name (the first is the baseline)."""
    records = [Record("train", name, "fwdbwd", {"tokens_per_step": 64}, t, t * 0.9, 10.0)
               for name, t in ms.items()]
    base = next(iter(ms))
    for r in records:
        r.baseline, r.ratio = base, r.ms_median / ms[base]
    return write_json(path, records)


def fake_scaling(path: Path, ms: dict[str, list[float]], lengths: Sequence[int],
                 bench: str = "attention-layer") -> Path:
    """A length-scaling bench JSON file; ``ms[name][i]`` is the time at ``lengths[i]``; the
    first name is the baseline; MACs for the baseline only."""
    base = next(iter(ms))
    records = [
        Record(bench, name, "fwd", {"seq_len": t, "batch": 1}, times[i], times[i], t / 64)
        for i, t in enumerate(lengths) for name, times in ms.items()
    ]
    fill_ratios(records, base)
    for r in records:
        r.shape = {**r.shape, "macs": r.shape["seq_len"] ** 2 * 100 if r.name == base else None}
    return write_json(path, records)
