"""Held-out quality curves of several runs, side by side: a Markdown table and a PNG plot.

A run directory (from ``attnlab train`` or ``attnlab distill``) holds ``summary.json`` and
``metrics.jsonl``; the curve is the held-out metric of every periodic evaluation: bits per
character for byte-level runs (``eval_bpc``), perplexity for BPE runs and language-model
students (``eval_ppl``), the sentence-embedding cosine to the teacher for encoder students
(``eval_cosine_mean``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.results.figures import new_figure, save_figure
from attnlab.train.runner import SUMMARY_FORMAT, read_metrics
from attnlab.utils.readers import read_json


@dataclasses.dataclass
class RunCurves:
    """One run: ``name``, its ``summary``, the ``metric`` key and its eval curve
    ``[(step, value)]``, the training loss curve ``[(step, loss)]`` and the run's own training
    time ``[(step, seconds)]``: the sum of its step times up to each logged step (periodic
    evaluations and checkpoints excluded), from the logged ``tokens`` and ``tokens_per_s``;
    ``run_dir`` where it was read from."""

    name: str
    summary: dict[str, Any]
    metric: str
    eval_curve: list[tuple[int, float]]
    train_curve: list[tuple[int, float]]
    train_time: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    run_dir: Path | None = None

    @property
    def tokens_per_step(self) -> float:
        """Training tokens per optimizer step (``summary`` tokens / steps; 0 if unknown)."""
        steps = self.summary.get("steps") or 0
        return self.summary.get("tokens", 0) / steps if steps else 0.0

    def seconds_at(self, step: float) -> float | None:
        """The run's own training time at ``step``, interpolated linearly in ``train_time``
        (from 0 s at step 0); None past the last logged step or without timing."""
        return _interpolate([(0, 0.0), *self.train_time], step)


def read_run(run_dir: str | os.PathLike[str], name: str | None = None) -> RunCurves:
    """Read a finished run. Raises ``FileNotFoundError`` naming the missing file and
    ``ValueError`` naming the damaged one (and its line)."""
    run_dir = Path(run_dir)
    for needed in ("summary.json", "metrics.jsonl"):
        if not (run_dir / needed).is_file():
            raise FileNotFoundError(f"{run_dir} is not a finished run: {needed} is missing")
    summary = read_json(run_dir / "summary.json", SUMMARY_FORMAT)
    rows = read_metrics(run_dir)
    evaluated = {key for row in rows for key in row} | set(summary)
    metric = next((m for m in METRICS if m in evaluated), "eval_bpc")
    eval_curve, train_curve, train_time = [], [], []
    seconds, tokens = 0.0, 0
    for row in rows:
        if metric in row:
            eval_curve.append((int(row["step"]), float(row[metric])))
        elif "loss" in row:
            train_curve.append((int(row["step"]), float(row["loss"])))
            if row.get("tokens_per_s"):  # a window of (tokens - previous tokens) at this rate
                seconds += (row["tokens"] - tokens) / row["tokens_per_s"]
                tokens = row["tokens"]
                train_time.append((int(row["step"]), seconds))
    return RunCurves(name or run_dir.name, summary, metric, eval_curve, train_curve, train_time,
                     run_dir)


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """y at ``x`` on the polyline through ``points`` (ascending x); None outside it."""
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


METRICS = {"eval_ppl": "held-out perplexity", "eval_bpc": "held-out bits per character",
           "eval_cosine_mean": "sentence-embedding cosine to the teacher"}
"""The eval metrics a run may report (the first one present is its curve), and their labels."""


def metric_label(metric: str) -> str:
    """Axis / table label of an eval metric key."""
    return METRICS[metric]


def curves_table(runs: Sequence[RunCurves]) -> str:
    """Markdown: one row per run, its parameters and the metric at every evaluated step."""
    if not runs:
        raise ValueError("no runs to report")
    metrics = {r.metric for r in runs}
    if len(metrics) > 1:
        raise ValueError(f"runs report different metrics {sorted(metrics)}; compare byte-level "
                         "runs with byte-level runs and BPE runs with BPE runs")
    steps = sorted({s for r in runs for s, _ in r.eval_curve})
    head = ["run", "params", *(f"step {s}" for s in steps)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        at = dict(r.eval_curve)
        cells = [f"{at[s]:.3f}" if s in at else "" for s in steps]
        lines.append("| " + " | ".join([r.name, f"{r.summary.get('params', 0):,}", *cells]) + " |")
    return f"{metric_label(runs[0].metric)} at each evaluation:\n\n" + "\n".join(lines)


def plot_curves(runs: Sequence[RunCurves], path: str | os.PathLike[str], title: str = "") -> Path:
    """Two panels: the eval curves and the training-loss curves against steps. Writes a PNG."""
    fig, (ax_eval, ax_train) = new_figure(2)
    for r in runs:
        (line,) = ax_eval.plot(*zip(*r.eval_curve, strict=True), marker="o", label=r.name)
        if r.train_curve:
            ax_train.plot(*zip(*r.train_curve, strict=True), label=r.name,
                          color=line.get_color(), alpha=0.8)
    ax_eval.set_ylabel(metric_label(runs[0].metric))
    ax_train.set_ylabel("training loss (nats per token)")
    for ax in (ax_eval, ax_train):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    ax_eval.legend()
    return save_figure(fig, path, title)


def plot_quality(
    runs: Sequence[RunCurves],
    path: str | os.PathLike[str],
    seconds_per_step: Mapping[str, float] | None = None,
    title: str = "",
) -> Path:
    """Two panels: each run's held-out metric against training tokens and against training
    wall-clock time. The time of a run named in ``seconds_per_step`` is steps x that step
    time (measured side by side with the others); any other run's is its own measured
    training time (``RunCurves.seconds_at``). Writes a PNG."""
    seconds_per_step = seconds_per_step or {}
    fig, (ax_tok, ax_time) = new_figure(2)
    for r in runs:
        steps = [s for s, _ in r.eval_curve]
        values = [v for _, v in r.eval_curve]
        (line,) = ax_tok.plot([s * r.tokens_per_step / 1e6 for s in steps], values,
                              marker="o", label=r.name)
        per_step = seconds_per_step.get(r.name)
        times = [s * per_step if per_step else r.seconds_at(s) for s in steps]
        timed = [(t, v) for t, v in zip(times, values, strict=True) if t is not None]
        if timed:
            ax_time.plot(*zip(*timed, strict=True), marker="o", label=r.name,
                         color=line.get_color())
    side = all(r.name in seconds_per_step for r in runs)
    ax_tok.set_xlabel("training tokens (millions)")
    ax_time.set_xlabel("training wall-clock time (s)" + (
        ": steps x step time measured side by side" if side else ", as each run measured it"))
    for ax in (ax_tok, ax_time):
        ax.set_ylabel(metric_label(runs[0].metric))
        ax.grid(True, alpha=0.3)
        ax.legend()
    return save_figure(fig, path, title)
