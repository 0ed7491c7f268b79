"""Summaries of scaling records (``attnlab bench attention`` and its layer variant): log-log
slopes of time and peak memory against the sequence length, and their Markdown tables."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnlab.results.records import Record

SLOPE_RANGE = (2048, 16384)


def loglog_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``log y`` against ``log x``; None with fewer than two x."""
    if len({x for x, _ in points}) < 2:
        return None
    lx = [math.log(x) for x, _ in points]
    ly = [math.log(y) for _, y in points]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def _series(records: Sequence[Record], field: str) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        out.setdefault(r.name, [])
        value = getattr(r, field)
        if r.skipped is None and value is not None and value > 0:
            out[r.name].append((r.shape["seq_len"], value))
    return {name: sorted(points) for name, points in out.items()}


def summarize(records: Sequence[Record]) -> dict[str, dict[str, float]]:
    """Log-log slopes per mechanism (least squares over its measured lengths):
    ``slopes`` of time; ``slopes_2k_16k`` of time over the lengths in [2048, 16384], only when
    both ends were measured; ``mem_slopes`` of peak memory."""
    lo, hi = SLOPE_RANGE
    slopes, ranged, mem = {}, {}, {}
    for name, points in _series(records, "ms_median").items():
        if (s := loglog_slope(points)) is not None:
            slopes[name] = s
        xs = {x for x, _ in points}
        if lo in xs and hi in xs:
            ranged[name] = loglog_slope([(x, y) for x, y in points if lo <= x <= hi])
    for name, points in _series(records, "peak_mem_mb").items():
        if (s := loglog_slope(points)) is not None:
            mem[name] = s
    return {"slopes": slopes, "slopes_2k_16k": ranged, "mem_slopes": mem}


def scaling_title(records: Sequence[Record], machine: str) -> str:
    r = records[0]
    s = r.shape
    kind = "causal" if s["causal"] else "bidirectional"
    return (f"attention core, {r.pass_}, {kind}: batch {s['batch']}, {s['heads']} heads x "
            f"{s['d_head']}, {s['dtype']}\n{machine}")


def format_summary(records: Sequence[Record], summary: Mapping[str, Any] | None = None) -> str:
    """Markdown: time (and ratio vs the records' baseline) and peak memory (and ratio vs
    eager, when measured) by length and mechanism, then the slopes of ``summarize``."""
    summary = summarize(records) if summary is None else summary
    names = list(dict.fromkeys(r.name for r in records))
    lengths = sorted({r.shape["seq_len"] for r in records})
    cell = {(r.shape["seq_len"], r.name): r for r in records}
    head = "| seq_len | " + " | ".join(names) + " |"
    rule = "|" + "---|" * (len(names) + 1)

    def table(fmt: Callable[[Record, int], str]) -> list[str]:
        rows = [head, rule]
        for t in lengths:
            cells = []
            for n in names:
                r = cell.get((t, n))
                cells.append("" if r is None else "skipped" if r.skipped else fmt(r, t))
            rows.append(f"| {t} | " + " | ".join(cells) + " |")
        return rows

    def time_cell(r: Record, t: int) -> str:
        ratio = "" if r.ratio is None else f" ({r.ratio:.2f}x)"
        return f"{r.ms_median:.1f}{ratio}"

    def mem_cell(r: Record, t: int) -> str:
        ref = cell.get((t, "eager"))
        if ref is None or ref.skipped or not ref.peak_mem_mb:
            return f"{r.peak_mem_mb:.1f}"
        return f"{r.peak_mem_mb:.1f} ({r.peak_mem_mb / ref.peak_mem_mb:.3f}x)"

    mem_title = "peak memory, MiB (x eager)" if "eager" in names else "peak memory, MiB"
    baseline = next((r.baseline for r in records if r.baseline), "baseline")
    lines = [f"time, median ms (x {baseline}):", *table(time_cell), "",
             f"{mem_title}:", *table(mem_cell), "",
             "log-log slope vs seq_len:",
             "| mechanism | time (all lengths) | time (2k-16k) | memory (all lengths) |",
             "|---|---|---|---|"]

    def fmt(key: str, name: str) -> str:
        value = summary.get(key, {}).get(name)
        return "" if value is None else f"{value:.2f}"

    for n in names:
        lines.append(f"| {n} | {fmt('slopes', n)} | {fmt('slopes_2k_16k', n)} | "
                     f"{fmt('mem_slopes', n)} |")
    return "\n".join(lines)
