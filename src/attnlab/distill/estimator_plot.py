"""The figure of an estimator distillation: each layer's training KL per step, and each
layer's held-out kept mass (untrained, distilled, best possible)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.results.figures import new_figure, save_figure


def plot_curves(summary: dict[str, Any], path: str | Path) -> Path:
    """Two panels from :func:`attnlab.distill.estimators.distill_estimators`' summary."""
    fig, (curves_ax, kept_ax) = new_figure(2, width=5.5, height=4.2)
    import matplotlib

    layers = summary["layers"]
    cmap = matplotlib.colormaps["viridis"]
    for i, row in enumerate(layers):
        curves_ax.plot(row["train_kl"], color=cmap(i / max(1, len(layers) - 1)), lw=0.8)
    curves_ax.set_xlabel("step")
    curves_ax.set_ylabel("training KL (teacher page mass || estimate)")
    curves_ax.set_yscale("log")
    curves_ax.set_title("per layer (dark: first, yellow: last)", fontsize=9)
    index = [row["layer"] for row in layers]
    for key, label, marker in (("kept_mass_block", "untrained (block top-k scores)", "s"),
                               ("kept_mass_after", "distilled", "o"),
                               ("kept_mass_best", "best pages (teacher)", "^")):
        kept_ax.plot(index, [row["held_out"][key] for row in layers], marker=marker, ms=3,
                     label=label)
    recipe = summary["recipe"]
    kept_ax.set_xlabel("layer")
    kept_ax.set_ylabel(f"held-out kept mass at {recipe['eval_budget']} keys per KV head")
    kept_ax.legend(fontsize=8)
    kept_ax.grid(True, alpha=0.3)
    title = (f"{summary['model']}: page estimators distilled frozen, layer by layer\n"
             f"{recipe['sequences']} x {recipe['seq_len']} tokens of {recipe['corpus']} "
             f"({recipe['split']}), {recipe['rows']} rows each, {recipe['steps']} steps; held "
             f"out: 1 sequence; {summary['minutes']:.1f} min on {summary['threads']} threads")
    return save_figure(fig, path, title)
