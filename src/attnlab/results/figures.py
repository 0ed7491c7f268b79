"""Plots of benchmark records: time and peak memory against a size, one line per candidate.

matplotlib is optional (``pip install 'attnlab[plot]'``); it is imported only when a plot is
drawn, with the Agg backend (files only, no display, no pyplot global state).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.results import Record
from attnlab.utils.outputs import PNG_SOFTWARE

MISSING = "plots need matplotlib: pip install 'attnlab[plot]'"


def require_matplotlib() -> None:
    """Raise ``ImportError`` with the install hint when matplotlib is not importable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(MISSING) from err


def machine_label(machine: dict[str, Any]) -> str:
    """``"<cpu or gpu>[, C cores], N threads, torch X"`` from a ``machine_info()`` dict
    (files written before it recorded the cores have none)."""
    device = machine.get("gpu") or machine.get("cpu") or "?"
    cores = f", {machine['cores']} cores" if machine.get("cores") else ""
    return f"{device}{cores}, {machine.get('threads')} threads, torch {machine.get('torch')}"


def plot_scaling(
    records: Sequence[Record],
    path: str | os.PathLike[str],
    *,
    x: str = "seq_len",
    xlabel: str | None = None,
    title: str = "",
) -> Path:
    """Two log-log panels, ``ms_median`` and ``peak_mem_mb`` against ``shape[x]`` (axis label
    ``xlabel``, default ``x``), one line per record name (in first-seen order); skipped
    records are left out. Writes a PNG."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series: dict[str, list[Record]] = {}
    for r in records:
        series.setdefault(r.name, [])
        if r.skipped is None:
            series[r.name].append(r)
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_t, ax_m = fig.subplots(1, 2)
    for name, rs in series.items():
        rs = sorted(rs, key=lambda r: r.shape[x])
        xs = [r.shape[x] for r in rs]
        (line,) = ax_t.plot(xs, [r.ms_median for r in rs], marker="o", label=name)
        ax_m.plot(xs, [r.peak_mem_mb for r in rs], marker="o", label=name,
                  color=line.get_color())
    sizes = sorted({r.shape[x] for r in records})
    for ax, label in ((ax_t, "time, median (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    ax_t.legend(loc="upper left")  # scaling lines rise to the right
    return save_figure(fig, path, title)


def save_figure(fig: Any, path: str | os.PathLike[str], title: str = "") -> Path:
    """Give ``fig`` its title (if any) and write it as a PNG, creating the parent folder."""
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Software": PNG_SOFTWARE})  # the write policy's mark
    return path


def new_figure(ncols: int, width: float = 5.5, height: float = 4.6,
               nrows: int = 1, squeeze: bool = True) -> tuple[Any, Any]:
    """A matplotlib ``Figure`` (Agg canvas, constrained layout) of ``nrows x ncols`` panels
    of ``width x height`` inches and its axes (as ``Figure.subplots``: one axis for one
    panel, unless ``squeeze`` is False: always a 2-D grid). Raises ``ImportError`` with the
    install hint without matplotlib."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)
