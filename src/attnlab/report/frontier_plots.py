"""The long-context frontier's plots: quality against serving speed per context length
(:func:`plot_frontier`), and quality against the key budget (:func:`plot_budget`). The
points and curves they draw come from :mod:`attnlab.report.frontier`. Need matplotlib."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.evals.variants import ORIGINAL
from attnlab.layers.registry import CORES
from attnlab.results.figures import new_figure, save_figure

DECODE_BATCH = 1
"""The decode batch whose speed the frontier plots (one user, the hardest case for SEA)."""

ORACLE_DASHES = ((5, 2), (2, 2), (8, 2, 2, 2), (1, 1))
"""Dash patterns that tell the oracle's horizontal lines apart, in turn."""


def marker(core: str | None) -> str:
    """The matplotlib marker of a core's points: its registered ``marker`` trait; a star for
    the original model, and the trait's default for a name no registry knows."""
    if core is None or core == ORIGINAL:
        return "*"
    if core not in CORES.names():
        return CORES.known_traits["marker"][0]
    return CORES.trait(core, "marker")


def _point_label(point: Mapping[str, Any]) -> str:
    """A marker's label: its variant without the core's name (``256``, ``p8 256``), ``all``
    for the original."""
    if point["core"] == ORIGINAL:
        return "all"
    return point["variant"].removeprefix(str(point["core"])).strip() or str(point["core"])


def plot_frontier(points: Sequence[Mapping[str, Any]], seq_len: int,
                  path: str | os.PathLike[str], title: str = "",
                  decode_batch: int = DECODE_BATCH) -> Path:
    """Quality (perplexity ratio; passkey accuracy: a row of panels per task measured)
    against speed (decode; prefill speedup over the original, each where measured) at
    ``seq_len``: one marker per variant, labelled with its keys per row (and what else
    tells it from its core's other variants, and its passkey protocol where the points
    mix protocols); the oracle (no fast path, never timed) is a dashed line at its quality,
    named with its value in the legend; other variants without a measured speed are counted
    under the panels (the report's table has them). Needs matplotlib."""
    mine = [p for p in points if p["seq_len"] == seq_len]
    tasks = (("ppl_ratio", "perplexity x original (lower is better)"),
             ("passkey", "passkey accuracy (higher is better)"))
    rows = [row for row in tasks if any(p.get(row[0]) is not None for p in mine)] or tasks
    speeds = (("decode_speedup", f"decode speedup over the original (batch {decode_batch})"),
              ("prefill_speedup", "prefill speedup over the original"))
    cols = [c for c in speeds if any(p.get(c[0]) is not None for p in mine)] or speeds[:1]
    fig, grid = new_figure(len(cols), width=5.2 if len(cols) > 1 else 7.0, height=4.2,
                           nrows=len(rows), squeeze=False)
    unmeasured = [p for p in mine if all(p.get(k) is None for k, _ in speeds)]
    protocols = list(dict.fromkeys(p["passkey_protocol"] for p in mine
                                   if p.get("passkey") is not None))
    for i, (qkey, qlabel) in enumerate(rows):
        # one passkey protocol: said on the axis; several: said at each point
        said = qkey == "passkey" and len(protocols) > 1
        if qkey == "passkey" and len(protocols) == 1:
            qlabel = f"passkey accuracy, {protocols[0]} (higher is better)"
        for j, (skey, slabel) in enumerate(cols):
            ax = grid[i][j]
            # the oracle's lines lie close together: named in the legend, not beside the line
            oracles = [p for p in unmeasured if p["core"] == "oracle" and p.get(qkey) is not None]
            for p, dashes in zip(oracles, itertools.cycle(ORACLE_DASHES)):
                ax.axhline(p[qkey], color="grey", lw=1, dashes=dashes,
                           label=f"{p['variant']}: {p[qkey]:.3f} (most attention kept, "
                                 "never timed)")
            for core in dict.fromkeys(p["core"] for p in mine):
                pts = [p for p in mine if p["core"] == core and p.get(qkey) is not None
                       and p.get(skey) is not None]
                if not pts:
                    continue
                ax.scatter([p[skey] for p in pts], [p[qkey] for p in pts], label=core,
                           marker=marker(core), s=60)
                for p in pts:
                    text = _point_label(p) + (f" ({p['passkey_protocol']})" if said else "")
                    ax.annotate(text, (p[skey], p[qkey]), textcoords="offset points",
                                xytext=(5, 4), fontsize=8)
            ax.axvline(1.0, color="grey", lw=0.8, ls=":")
            values = [p[qkey] for p in mine if p.get(qkey)]
            if qkey == "ppl_ratio" and values and max(values) / min(values) > 5:
                ax.set_yscale("log")  # a collapsed model would flatten every other point
            ax.set_xlabel(slabel)
            ax.set_ylabel(qlabel)
            ax.grid(alpha=0.3)
            if (oracles or (i == 0 and j == 0)) and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    title = title or f"quality against speed at {seq_len} tokens"
    if others := [p for p in unmeasured if p["core"] != "oracle"]:
        title += f"\n(not drawn: {len(others)} variant(s) with no measured speed; see the table)"
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def plot_budget(curves: Mapping[str, Sequence[tuple[int, float, Any]]],
                path: str | os.PathLike[str], title: str) -> Path:
    """Perplexity ratio against the budget (keys per query token per KV head, log axis),
    one line per variant name (:func:`attnlab.report.frontier.budget_curves`), 95% intervals
    as error bars. Needs matplotlib."""
    fig, ax = new_figure(1, width=6.4, height=4.4)
    for name, pts in curves.items():
        budgets = [p[0] for p in pts]
        ratios = [p[1] for p in pts]
        low = [p[1] - p[2][0] if p[2] else 0.0 for p in pts]
        high = [p[2][1] - p[1] if p[2] else 0.0 for p in pts]
        ax.errorbar(budgets, ratios, yerr=[low, high], marker=marker(name.split()[0]),
                    capsize=3, label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget: keys read per query token per KV head")
    ax.set_ylabel("perplexity x original (lower is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
