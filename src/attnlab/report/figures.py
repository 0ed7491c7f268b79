"""Derived figures of the report: the headline (quality, step time and time to the
baseline's quality per trained run), distilled students against their teachers, crossover
lengths of the attention mechanisms, and MACs against measured time.

Ratios are only ever taken between records of one bench file (measured side by side in one
process, alternating repetitions, median of at least 5, warm-up excluded). Without step
times for a run, its wall-clock axis is its own measured training time and no speed ratio is
given for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.report.curves import RunCurves
from attnlab.report.inputs import ReportInputs
from attnlab.results import Record


def step_reaching(curve: Sequence[tuple[int, float]], target: float) -> float | None:
    """The first step at which the eval curve reaches ``target`` or below, interpolated
    linearly between evaluations (None if it never does)."""
    prev: tuple[int, float] | None = None
    for step, value in curve:
        if value <= target:
            if prev is None or prev[1] == value:
                return float(step)
            (s0, v0) = prev
            return s0 + (step - s0) * (v0 - target) / (v0 - value)
        prev = (step, value)
    return None


def _final(run: RunCurves) -> float | None:
    value = run.summary.get(run.metric)
    return float(value) if value is not None else (run.eval_curve[-1][1] if run.eval_curve
                                                  else None)


def headline(inputs: ReportInputs) -> list[dict[str, Any]]:
    """One row per trained run: quality, side-by-side step time and its ratio, training time
    for the tokens, and the time to reach the baseline's final quality. The baseline is the
    run named like the first step-time record (the probe's baseline), else the first run."""
    if not inputs.runs:
        return []
    step = {r.name: r for r in inputs.step_times}
    names = [r.name for r in inputs.runs]
    base_name = next((r.name for r in inputs.step_times if r.name in names), names[0])
    base = inputs.runs[names.index(base_name)]
    target = _final(base)
    rows = []
    for run in inputs.runs:
        rec = step.get(run.name)
        ms = rec.ms_median if rec is not None else None
        steps = run.summary.get("steps", 0)
        reach = step_reaching(run.eval_curve, target) if target is not None else None
        if run is base and target is not None:
            reach = float(steps)
        row: dict[str, Any] = {
            "model": run.name, "params": run.summary.get("params"),
            "tokens": run.summary.get("tokens"), "steps": steps, "metric": run.metric,
            "final": _final(run), "side_by_side": ms is not None, "step_ms": ms,
            "step_peak_mib": rec.peak_mem_mb if rec is not None else None,
            "train_s_own": run.summary.get("train_wall_s"),
            "baseline": base.name,
        }
        if ms is not None:
            row["train_s"] = steps * ms / 1e3
            row["reach_s"] = None if reach is None else reach * ms / 1e3
        else:
            row["train_s"] = run.summary.get("train_wall_s")
            row["reach_s"] = None if reach is None else run.seconds_at(reach)
        rows.append(row)
    base_row = rows[names.index(base.name)]
    for row in rows:
        both = row["side_by_side"] and base_row["side_by_side"]
        row["step_ratio"] = row["step_ms"] / base_row["step_ms"] if both else None
        row["reach_ratio"] = (row["reach_s"] / base_row["reach_s"]
                              if both and row["reach_s"] is not None and base_row["reach_s"]
                              else None)
    return rows


def students(inputs: ReportInputs) -> list[dict[str, Any]]:
    """One row per distilled student: teacher and student quality on the same held-out
    tokens, and the side-by-side training-step times of the student's and teacher's
    architectures when the step-time records hold them (by the run names)."""
    step = {r.name: r for r in inputs.step_times}
    rows = []
    for name, s in inputs.students:
        teacher = Path(s.get("teacher", "")).name
        row = {"student": name, "teacher": teacher,
               "attention": s.get("student_attention"), "steps": s.get("steps"),
               "tokens": s.get("tokens"), "seq_len": s.get("seq_len"),
               "teacher_ppl": s.get("teacher_ppl"), "student_ppl": s.get("student_ppl"),
               "teacher_bpc": s.get("teacher_bpc"), "student_bpc": s.get("student_bpc"),
               "ppl_ratio": s.get("ppl_ratio"), "step_ms": None, "teacher_step_ms": None,
               "step_ratio": None}
        if name in step and teacher in step:
            row["step_ms"], row["teacher_step_ms"] = step[name].ms_median, step[teacher].ms_median
            row["step_ratio"] = row["step_ms"] / row["teacher_step_ms"]
        rows.append(row)
    return rows


def crossovers(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """Per mechanism (not the baseline): the lengths measured, the smallest length from
    which it is faster than the baseline at every longer measured length (None if never),
    and its best and worst time ratios with their lengths."""
    out: dict[str, dict[str, Any]] = {}
    by_name: dict[str, list[Record]] = {}
    for r in records:
        if r.skipped is None and r.ratio is not None and r.name != r.baseline:
            by_name.setdefault(r.name, []).append(r)
    for name, rs in by_name.items():
        rs.sort(key=lambda r: r.shape["seq_len"])
        wins_from = None
        for r in reversed(rs):
            if r.ratio >= 1:
                break
            wins_from = r.shape["seq_len"]
        best = min(rs, key=lambda r: r.ratio)
        worst = max(rs, key=lambda r: r.ratio)
        out[name] = {"baseline": rs[0].baseline, "lengths": [r.shape["seq_len"] for r in rs],
                     "faster_from": wins_from, "best_ratio": best.ratio,
                     "best_at": best.shape["seq_len"], "worst_ratio": worst.ratio,
                     "worst_at": worst.shape["seq_len"]}
    return out


def macs_rows(inputs: ReportInputs) -> list[dict[str, Any]]:
    """Forward MACs against measured time: attention layers at each length (those with MAC
    accounting) and whole training steps of the trained runs (model MACs per token x tokens
    per step, from each run's config)."""
    from attnlab.metrics import attention_cost
    from attnlab.train import load_run_config

    rows = []
    for bench, records in inputs.scaling.items():
        for r in records:
            if r.skipped is None and r.shape.get("macs"):
                rows.append({"what": bench, "name": r.name, "seq_len": r.shape["seq_len"],
                             "macs": r.shape["macs"], "ms": r.ms_median, "ratio": r.ratio})
    step = {r.name: r for r in inputs.step_times}
    for run in inputs.runs:
        rec = step.get(run.name)
        if rec is None or run.run_dir is None or not (run.run_dir / "config.yaml").is_file():
            continue
        config = run.run_dir / "config.yaml"
        cost = attention_cost(load_run_config(config))
        rows.append({"what": "train-step", "name": run.name, "seq_len": None,
                     "macs": cost["model_macs_per_token"] * rec.shape["tokens_per_step"],
                     "ms": rec.ms_median, "ratio": rec.ratio})
    return rows


def mark_inconclusive(rows: list[dict[str, Any]], key: str, stage: str,
                      shortfalls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with ``inconclusive``: the reason their ``key`` (a model or student name) is
    below the minimum of ``stage`` (a demo's ``shortfalls``), or None."""
    for row in rows:
        row["inconclusive"] = next((f["reason"] for f in shortfalls
                                    if f["stage"] == stage and row[key] in f["names"]), None)
    return rows


def sea_grid_axes(grid: Sequence[Mapping[str, Any]]
                  ) -> tuple[list[int], list[int], dict[tuple[int, int], Mapping[str, Any]]]:
    """A SEA inference grid's dynamic ks and query skips (ascending) and its entry of each
    ``(k, query_skip)`` measured."""
    return (sorted({g["k"] for g in grid}), sorted({g["query_skip"] for g in grid}),
            {(g["k"], g["query_skip"]): g for g in grid})
