"""Tables and plots of ``attnlab bench serve`` records (see :mod:`attnlab.bench.serve`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.results import Record
from attnlab.results.figures import machine_label, require_matplotlib, save_figure

BASELINE = "original"  # the unconverted model's records (``attnlab bench hf`` and ``serve``)
DTYPE_ORDER = ("float32", "bfloat16", "float16")


# ---------------------------------------------------------------- summary


def _key(r: Record) -> tuple[str, int, int]:
    return r.shape["dtype"], r.shape["batch"], r.shape["seq_len"]


def summarize(records: Sequence[Record]) -> dict[str, dict[str, dict[str, dict[str, dict]]]]:
    """``{name: {dtype: {batch: {seq_len: values}}}}`` (keys as strings), the values of a
    measured cell being some of ``decode_tokens_per_s`` (``batch`` / median step time),
    ``decode_speedup`` (original's step time / this model's, = the tok/s ratio),
    ``decode_peak_mem_ratio``, ``prefill_ms``, ``prefill_speedup`` (original's ms / this
    model's) and ``prefill_peak_mem_ratio`` (this model's peak MiB / original's; absent for a
    record without a peak, such as another engine's)."""
    base = {(r.shape["op"], *_key(r)): r for r in records if r.name == BASELINE}
    out: dict[str, dict[str, dict[str, dict[str, dict]]]] = {}
    for r in records:
        if r.skipped is not None:
            continue
        op = r.shape["op"]
        ref = base[(op, *_key(r))]
        dtype, batch, seq_len = _key(r)
        values = (out.setdefault(r.name, {}).setdefault(dtype, {}).setdefault(str(batch), {})
                  .setdefault(str(seq_len), {}))
        if op == "decode":
            values["decode_tokens_per_s"] = batch / (r.ms_median / 1e3)
        else:
            values["prefill_ms"] = r.ms_median
        values[f"{op}_speedup"] = ref.ms_median / r.ms_median
        if r.peak_mem_mb is not None:
            values[f"{op}_peak_mem_ratio"] = r.peak_mem_mb / ref.peak_mem_mb
    return out


OPS = ("decode", "prefill")
_MAIN = {"decode": ("decode_tokens_per_s", "tok/s"), "prefill": ("prefill_ms", "ms")}


def _value_cell(values: Mapping[str, float], op: str, baseline: bool) -> str:
    """``"123.4 (0.52x)"``: an op's tok/s or ms and its ratio to the original's (the same
    quantity's: tok/s ratio = speedup, ms ratio = 1 / speedup); no ratio for the original."""
    key, _ = _MAIN[op]
    if key not in values:
        return ""
    if baseline:
        return f"{values[key]:.1f}"
    speedup = values[f"{op}_speedup"]
    return f"{values[key]:.1f} ({speedup if op == 'decode' else 1 / speedup:.2f}x)"


def precision_label(records: Sequence[Record], dtype: str) -> str:
    """``dtype``, or ``"bfloat16, int8 weights"`` when the records' models ran with
    weight-only int8 linear layers (``bench serve --weights int8``)."""
    int8 = any(r.shape.get("weights") == "int8" for r in records)
    return f"{dtype}, int8 weights" if int8 else dtype


def format_summary(records: Sequence[Record]) -> str:
    """Markdown, one row per (dtype, batch, T): decode tok/s of every model (x original),
    prefill ms of every model (x original) when prefills were run, and each core's peak
    MiB ratio to the original (decode / prefill)."""
    names = list(dict.fromkeys(r.name for r in records))
    cores = [n for n in names if n != BASELINE]
    ops = [op for op in OPS if any(r.shape["op"] == op for r in records)]
    summary = summarize(records)
    head = [f"{n} {op} {_MAIN[op][1]}" for op in ops for n in names]
    head += [f"{n} peak MiB ratio ({' / '.join(ops)})" for n in cores]
    lines = ["| dtype | batch | T | " + " | ".join(head) + " |",
             "|" + "---|" * (3 + len(head))]
    for dtype, batch, seq_len in sorted(dict.fromkeys(_key(r) for r in records),
                                        key=lambda k: (DTYPE_ORDER.index(k[0]), k[1], k[2])):
        cell = {n: summary.get(n, {}).get(dtype, {}).get(str(batch), {}).get(str(seq_len), {})
                for n in names}
        row = [_value_cell(cell[n], op, n == BASELINE) for op in ops for n in names]
        for n in cores:
            ratios = (cell[n].get(f"{op}_peak_mem_ratio") for op in ops)
            row.append(" / ".join("-" if v is None else f"{v:.2f}x" for v in ratios))
        lines.append(f"| {precision_label(records, dtype)} | {batch} | {seq_len} | "
                     + " | ".join(row) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- plot


def _tick_subs(values: Sequence[float]) -> tuple[float, ...]:
    """Labelled ticks per decade of a log axis spanning ``values``: more when it is short."""
    decades = math.log10(max(values) / min(values)) if values else 0.0
    if decades < 1:
        return (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0)
    return (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)


def plot_decode(records: Sequence[Record], path: str | os.PathLike[str], *,
                machine: Mapping[str, Any] | None = None) -> Path:
    """Decode tokens/s against context length (log-2 x, log y), one line per (model, batch):
    a colour per model (the original dashed), a marker per batch; one panel per dtype, one
    legend on the right. ``machine``: for the title (default: this machine). Writes a PNG."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    from attnlab.results import machine_info

    decode = [r for r in records if r.shape["op"] == "decode" and r.skipped is None]
    dtypes = list(dict.fromkeys(r.shape["dtype"] for r in decode))
    names = list(dict.fromkeys(r.name for r in decode))
    batches = sorted({r.shape["batch"] for r in decode})
    fig = Figure(figsize=(6.5 * max(len(dtypes), 1) + 1, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(dtypes), 1), squeeze=False)[0]
    colors = {n: f"C{i}" for i, n in enumerate(names)}
    markers = dict(zip(batches, "os^Dvp*hX<>", strict=False))
    sizes = sorted({r.shape["seq_len"] for r in decode})
    for ax, dtype in zip(axes, dtypes, strict=False):
        for name in names:
            for batch in batches:
                rs = sorted((r for r in decode if (r.name, r.shape["batch"], r.shape["dtype"])
                             == (name, batch, dtype)), key=lambda r: r.shape["seq_len"])
                if rs:
                    ax.plot([r.shape["seq_len"] for r in rs],
                            [batch / (r.ms_median / 1e3) for r in rs],
                            color=colors[name], marker=markers.get(batch, "o"),
                            linestyle="--" if name == BASELINE else "-",
                            label=f"{name}, batch {batch}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        rates = [r.shape["batch"] / (r.ms_median / 1e3) for r in decode
                 if r.shape["dtype"] == dtype]
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=_tick_subs(rates)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("context length (cached tokens)")
        ax.set_ylabel("decode tokens/s (batch / step time)")
        ax.set_title(f"decode throughput, {precision_label(decode, dtype)}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    handles = {}  # one legend for all panels, outside them: no line hidden behind it
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:  # below the panels: nothing hides a line or the title
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncols=min(len(handles), len(batches)), fontsize=8)
    model = Path(decode[0].shape["model"]).name if decode else "?"
    title = f"attnlab bench serve: {model}; {machine_label(machine or machine_info())}"
    return save_figure(fig, path, title)
