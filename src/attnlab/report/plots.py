"""The report's PNG plots: MACs against measured time, and SEA's dynamic-k x query-skip grid.

Quality curves are drawn by :mod:`attnlab.report.curves`, the frontier by
:mod:`attnlab.report.frontier_plots`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.report.figures import sea_grid_axes
from attnlab.results.figures import new_figure, save_figure


def _axis_scale(values: Sequence[float]) -> str:
    """Log where the values span a decade; linear otherwise (a log axis over less than a
    decade labels its minor ticks, which collide)."""
    return "log" if max(values) >= 10 * min(values) else "linear"


def plot_macs(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str],
              title: str = "") -> Path:
    """MACs against measured time, log-log: attention layers (one line per mechanism across
    lengths) and whole training steps (one point per model), each panel with the line
    ``time = MACs / rate`` of its baseline's best rate for reference; an axis whose values
    span less than a decade is linear. Writes a PNG."""
    panels = [("attention layer forward", [r for r in rows if r["what"] != "train-step"]),
              ("training step (forward MACs; time fwd+bwd+update)",
               [r for r in rows if r["what"] == "train-step"])]
    panels = [(name, rs) for name, rs in panels if rs]
    fig, axes = new_figure(len(panels))
    axes = axes if len(panels) > 1 else [axes]
    for ax, (name, rs) in zip(axes, panels, strict=True):
        series: dict[str, list[dict[str, Any]]] = {}
        for r in rs:
            series.setdefault(r["name"], []).append(r)
        for label, points in series.items():
            points.sort(key=lambda r: r["macs"])
            ax.plot([p["macs"] for p in points], [p["ms"] for p in points],
                    marker="o", linestyle="-" if len(points) > 1 else "none", label=label)
        rate = max(r["macs"] / r["ms"] for r in series[next(iter(series))])
        xs = sorted({r["macs"] for r in rs})
        ax.plot([xs[0], xs[-1]], [xs[0] / rate, xs[-1] / rate], color="grey", linestyle=":",
                label=f"time proportional to MACs ({next(iter(series))}'s best rate)")
        ax.set_xscale(_axis_scale(xs))
        ax.set_yscale(_axis_scale([r["ms"] for r in rs] + [xs[0] / rate, xs[-1] / rate]))
        ax.set_xlabel("forward MACs (multiply-accumulates)")
        ax.set_ylabel("measured time, median (ms)")
        ax.set_title(name, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path, title)


def plot_sea_grid(student_summaries: Sequence[tuple[str, dict[str, Any]]],
                  path: str | os.PathLike[str], title: str = "") -> Path:
    """Perplexity of each distilled SEA student against its dynamic k (log2 axis), one line
    per query skip, with its teacher's perplexity as a dashed line. Writes a PNG."""
    fig, ax = new_figure(1, width=6.5)
    for name, s in student_summaries:
        skips = sorted({g["query_skip"] for g in s["inference"]})
        for skip in skips:
            points = sorted((g["k"], g["ppl"]) for g in s["inference"] if g["query_skip"] == skip)
            ax.plot(*zip(*points, strict=True), marker="o",
                    label=f"{name}, query skip {skip}")
        ax.axhline(s["teacher_ppl"], linestyle="--", color="black",
                   label=f"teacher {Path(s['teacher']).name} (dense)")
    ks = sorted({g["k"] for _, s in student_summaries for g in s["inference"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlabel("dynamic k at inference (keys kept per query and head)")
    ax.set_ylabel("held-out perplexity per token")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, title)


COST_PANELS = (("ppl", "held-out perplexity", "{:.3f}"),
               ("latency_x_teacher", "forward time / dense teacher's", "{:.2f}x"),
               ("peak_x_teacher", "peak memory / dense teacher's", "{:.2f}x"))


def plot_sea_costs(student_summaries: Sequence[tuple[str, dict[str, Any]]],
                   path: str | os.PathLike[str], title: str = "") -> Path:
    """SEA's Table A.6 as heatmaps, one row per student with measured costs: perplexity,
    forward time and peak memory (both as multiples of the teacher's) over dynamic k
    (columns) and query skip (rows), each cell annotated. Writes a PNG."""
    import numpy as np

    fig, axes = new_figure(len(COST_PANELS), width=4.2, height=3.2,
                           nrows=len(student_summaries), squeeze=False)
    for row, (name, s) in zip(axes, student_summaries, strict=True):
        ks, skips, cell = sea_grid_axes(s["inference"])
        for ax, (key, label, fmt) in zip(row, COST_PANELS, strict=True):
            values = np.array([[cell[k, q][key] if (k, q) in cell else np.nan for k in ks]
                               for q in skips])
            ax.imshow(values, cmap="viridis_r", aspect="auto")
            middle = np.nanmean(values)
            for (i, j), v in np.ndenumerate(values):
                if not np.isnan(v):
                    ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=8,
                            color="white" if v > middle else "black")
            ax.set_xticks(range(len(ks)), [str(k) for k in ks])
            ax.set_yticks(range(len(skips)), [str(q) for q in skips])
            ax.set_xlabel("dynamic k (keys per query and head)")
            ax.set_ylabel("query skip")
            ax.set_title(f"{name}: {label}", fontsize=9)
    return save_figure(fig, path, title)
