"""The report's Markdown tables and text, and the compact tables the CLI prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attnlab.report.curves import metric_label
from attnlab.report.figures import sea_grid_axes


def fmt(value: Any, spec: str = ".3f", none: str = "-") -> str:
    """``value`` formatted with ``spec``; ``none`` if it is None."""
    return none if value is None else format(value, spec)


def name_cell(row: Mapping[str, Any], key: str) -> str:
    """``row[key]``, flagged when the row is inconclusive (:func:`~attnlab.report.figures.
    mark_inconclusive`)."""
    return f"{row[key]} (inconclusive)" if row.get("inconclusive") else str(row[key])


def budget_lines(demo: Mapping[str, Any]) -> list[str]:
    """Markdown lines: the figures of a demo below their minimum, and what the demo decided
    when its budget could not cover the minimums."""
    md = []
    if demo.get("shortfalls"):
        md += ["**Inconclusive figures** (below the minimum they need to mean something):", ""]
        md += [f"- {f['reason']}." for f in demo["shortfalls"]] + [""]
    elif "minimums" in demo:
        md += ["Every stage reached the minimum its figures need ("
               + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in demo["minimums"].items())
               + ").", ""]
    if demo.get("decisions"):
        md += ["What the demo did when the time left could not cover every minimum:", ""]
        md += [f"- {d}." for d in demo["decisions"]] + [""]
    return md


def headline_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown of :func:`attnlab.report.figures.headline` rows."""
    if not rows:
        return ""
    label = {"eval_bpc": "held-out bpc", "eval_ppl": "held-out ppl"}[rows[0]["metric"]]
    base = rows[0]["baseline"]
    side = all(r["side_by_side"] for r in rows)
    lines = [f"| model | params | tokens | {label} | step ms | x {base} | training s | "
             f"s to {base}'s final | x {base} | peak MiB/step | own run s |",
             "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {name_cell(r, 'model')} | {fmt(r['params'], ',')} | {fmt(r['tokens'], ',')} | "
            f"{fmt(r['final'])} | {fmt(r['step_ms'], '.0f')} | {fmt(r['step_ratio'], '.2f')} "
            f"| {fmt(r['train_s'], '.1f')} | {fmt(r['reach_s'], '.1f', 'not reached')} | "
            f"{fmt(r['reach_ratio'], '.2f')} | {fmt(r['step_peak_mib'], '.0f')} | "
            f"{fmt(r['train_s_own'], '.1f')} |")
    note = ("Step ms: one training step (forward, backward, optimizer) measured side by side "
            "with the other models in one process (alternating repetitions, median of at least "
            "5, warm-up excluded); training s = steps x step ms, and s to the baseline's final "
            "quality likewise (interpolated between evaluations). Own run s: the summed step "
            "times each training run measured for itself, shown for reference only (load on "
            "the machine, and runs training beside it, differ between runs)." if side else
            "Some runs have no side-by-side step time: their training s is their own measured "
            "time (separate runs: not comparable as a ratio).")
    return "\n".join(lines) + "\n\n" + note


def students_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown of :func:`attnlab.report.figures.students` rows."""
    lines = ["| student | teacher | distillation steps | teacher ppl | student ppl | x teacher "
             "| teacher bpc | student bpc | train step ms | x teacher's |", "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {name_cell(r, 'student')} | {r['teacher']} | {r['steps']} | "
            f"{fmt(r['teacher_ppl'])} | "
            f"{fmt(r['student_ppl'])} | {fmt(r['ppl_ratio'], '.2f')} | "
            f"{fmt(r['teacher_bpc'])} | {fmt(r['student_bpc'])} | "
            f"{fmt(r['step_ms'], '.0f')} | {fmt(r['step_ratio'], '.2f')} |")
    return "\n".join(lines)


def _grid_cell(g: Mapping[str, Any]) -> str:
    """Perplexity (bpc), with the setting's time and memory against the teacher if measured."""
    text = f"{g['ppl']:.3f} ({g['bpc']:.3f})"
    if "latency_x_teacher" in g:
        text += f"; {g['latency_x_teacher']:.2f}x time, {g['peak_x_teacher']:.2f}x memory"
    return text


def sea_grid_table(name: str, summary: Mapping[str, Any]) -> str:
    """Markdown: the student's perplexity (bpc) at each dynamic k (rows) and query skip, and
    where measured each setting's forward time and peak memory as multiples of the teacher's
    (SEA's Table A.6), with the teacher's own values under the table."""
    ks, skips, cell = sea_grid_axes(summary["inference"])
    lines = [f"| {name}: k \\ query skip | " + " | ".join(map(str, skips)) + " |",
             "|" + "---|" * (len(skips) + 1)]
    for k in ks:
        cells = [_grid_cell(cell[k, s]) if (k, s) in cell else "" for s in skips]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    if teacher := summary.get("inference_teacher"):
        lines += ["", f"Time and memory: one forward of {teacher['batch']} x "
                      f"{teacher['seq_len']} tokens, every setting and the dense teacher "
                      f"alternating ({teacher['reps']} rounds, medians); the teacher: "
                      f"{teacher['latency_ms']:.1f} ms, {teacher['peak_mb']:.1f} MiB peak."]
    return "\n".join(lines)


def crossover_lines(found: Mapping[str, Mapping[str, Any]]) -> str:
    """One sentence per mechanism: where it beats the baseline, or that it never does."""
    lines = []
    for name, c in found.items():
        base, lo, hi = c["baseline"], c["lengths"][0], c["lengths"][-1]
        if c["faster_from"] is None:
            lines.append(f"- **{name}** is slower than {base} at every measured length "
                         f"({lo}-{hi}); closest {c['best_ratio']:.2f}x at {c['best_at']}.")
        elif c["faster_from"] == lo:
            lines.append(f"- **{name}** is faster than {base} at every measured length "
                         f"({lo}-{hi}): {c['worst_ratio']:.2f}x at {c['worst_at']} to "
                         f"{c['best_ratio']:.2f}x at {c['best_at']}.")
        else:
            lines.append(f"- **{name}** is faster than {base} from {c['faster_from']} tokens "
                         f"on ({c['best_ratio']:.2f}x at {c['best_at']}); slower below "
                         f"({c['worst_ratio']:.2f}x at {c['worst_at']}).")
    return "\n".join(lines)


def machine_table(machine: Mapping[str, Any]) -> str:
    """Markdown: the machine the measurements ran on."""
    keys = ("cpu", "cores", "threads", "gpu", "torch", "malloc_tuned")
    return ("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n| "
            + " | ".join(str(machine.get(k)) for k in keys) + " |")


def compact_table(results: Mapping[str, Any]) -> str:
    """The short tables ``attnlab demo`` and ``attnlab report`` print at the end: each model's
    quality, step time and time to the baseline's quality (ratios to the baseline), each
    student against its teacher, and where each attention mechanism beats the baseline."""
    blocks = []
    if results["headline"]:
        first = results["headline"][0]
        base, label = first["baseline"], metric_label(first["metric"])
        lines = [f"| model | {label} | step time x {base} | time to {base}'s quality x |",
                 "|---|---|---|---|"]
        lines += [f"| {name_cell(r, 'model')} | {fmt(r['final'])} | "
                  f"{fmt(r['step_ratio'], '.2f')} | "
                  f"{fmt(r['reach_ratio'], '.2f', 'not reached' if r['reach_s'] is None else '-')}"
                  " |" for r in results["headline"]]
        blocks.append("\n".join(lines))
    if results["students"]:
        lines = ["| student | ppl | teacher ppl | x teacher |", "|---|---|---|---|"]
        lines += [f"| {name_cell(r, 'student')} | {fmt(r['student_ppl'])} | "
                  f"{fmt(r['teacher_ppl'])} | {fmt(r['ppl_ratio'], '.2f')} |"
                  for r in results["students"]]
        blocks.append("\n".join(lines))
    for bench, s in results["scaling"].items():
        lines = [f"| {bench} | faster than baseline from T = | best time ratio (at T) |",
                 "|---|---|---|"]
        for name, c in s["crossovers"].items():
            faster = c["faster_from"] or f"not up to {c['lengths'][-1]}"
            lines.append(f"| {name} | {faster} | {c['best_ratio']:.2f} ({c['best_at']}) |")
        blocks.append("\n".join(lines))
    if results.get("frontier"):
        lines = ["| T | variant | ppl x original | decode x | prefill x |", "|---|---|---|---|---|"]
        lines += [f"| {r['seq_len']} | {r['variant']} | {fmt(r.get('ppl_ratio'), '.3f')} | "
                  f"{fmt(r.get('decode_speedup'), '.2f')} | "
                  f"{fmt(r.get('prefill_speedup'), '.2f')} |" for r in results["frontier"]]
        blocks.append("\n".join(lines))
    blocks += [f"INCONCLUSIVE: {f['reason']}." for f in results.get("inconclusive", [])]
    return "\n\n".join(blocks)
