"""Held-out quality curves of several runs, side by side: a Markdown table and a PNG plot.

A run directory (from ``attnlab train``) holds ``summary.json`` and ``metrics.jsonl``; the
curve is the held-out metric of every periodic evaluation: bits per character for byte-level
runs (``eval_bpc``), perplexity for BPE runs (``eval_ppl``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.bench.plot import require_matplotlib, save_figure


@dataclasses.dataclass
class RunCurves:
    """One run: ``name``, its ``summary``, the ``metric`` key and its eval curve
    ``[(step, value)]``, and the training loss curve ``[(step, loss)]``."""

    name: str
    summary: dict[str, Any]
    metric: str
    eval_curve: list[tuple[int, float]]
    train_curve: list[tuple[int, float]]


def read_run(run_dir: str | os.PathLike[str], name: str | None = None) -> RunCurves:
    """Read a finished run. Raises ``FileNotFoundError`` naming the missing file."""
    run_dir = Path(run_dir)
    for needed in ("summary.json", "metrics.jsonl"):
        if not (run_dir / needed).is_file():
            raise FileNotFoundError(f"{run_dir} is not a finished run: {needed} is missing")
    summary = json.loads((run_dir / "summary.json").read_text())
    metric = "eval_ppl" if "eval_ppl" in summary else "eval_bpc"
    eval_curve, train_curve = [], []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if metric in row:
            eval_curve.append((int(row["step"]), float(row[metric])))
        elif "loss" in row:
            train_curve.append((int(row["step"]), float(row["loss"])))
    return RunCurves(name or run_dir.name, summary, metric, eval_curve, train_curve)


def _label(metric: str) -> str:
    return {"eval_bpc": "held-out bits per character", "eval_ppl": "held-out perplexity"}[metric]


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
    return f"{_label(runs[0].metric)} at each evaluation:\n\n" + "\n".join(lines)


def plot_curves(runs: Sequence[RunCurves], path: str | os.PathLike[str], title: str = "") -> Path:
    """Two panels: the eval curves and the training-loss curves against steps. Writes a PNG."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_eval, ax_train = fig.subplots(1, 2)
    for r in runs:
        (line,) = ax_eval.plot(*zip(*r.eval_curve, strict=True), marker="o", label=r.name)
        if r.train_curve:
            ax_train.plot(*zip(*r.train_curve, strict=True), label=r.name,
                          color=line.get_color(), alpha=0.8)
    ax_eval.set_ylabel(_label(runs[0].metric))
    ax_train.set_ylabel("training loss (nats per token)")
    for ax in (ax_eval, ax_train):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    ax_eval.legend()
    return save_figure(fig, path, title)
