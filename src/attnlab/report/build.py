"""The one-command report: "is it faster in wall-clock, and at what quality?".

:func:`collect` reads any mix of inputs, :func:`build_report` turns them into ``report.md``,
PNG figures and ``results.json`` (every figure of the tables and plots) in one folder:

* run folders of ``attnlab train`` (``summary.json`` + ``metrics.jsonl``): the quality
  curves and the headline table;
* run folders of ``attnlab distill`` (also ``distill.yaml``): teacher vs student quality and
  SEA's dynamic-k x query-skip grid;
* bench JSON files (:mod:`attnlab.bench.common`): ``train`` records give the training step
  times measured side by side (the wall-clock axis and every speed ratio of the headline),
  ``attention`` / ``attention-layer`` records the time and memory against sequence length,
  others a plain table;
* ``demo.json`` (written by ``attnlab demo``): the demo's budget and stage times;
* ``attnlab long-context`` JSON files: the long-context frontier (quality kept against the
  speed of a ``serve`` bench file, :mod:`attnlab.report.frontier`);
* a folder holding none of these at its top (e.g. a demo's output): its entries, recursively.

Ratios are only ever taken between records of one bench file (measured side by side in one
process, alternating repetitions, median of at least 5, warm-up excluded). Without step
times for a run, its wall-clock axis is its own measured training time and no speed ratio is
given for it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.bench.attention import format_summary, summarize
from attnlab.bench.common import Record, format_table, machine_info, read_json
from attnlab.bench.plot import machine_label, plot_scaling, save_figure
from attnlab.report import frontier
from attnlab.report.curves import (
    RunCurves,
    curves_table,
    metric_label,
    new_figure,
    plot_quality,
    read_run,
)
from attnlab.utils.io import atomic_write_json, atomic_write_text

logger = logging.getLogger(__name__)

SCALING_BENCHES = ("attention-layer", "attention")
STEP_BENCH = "train"
LONG_CONTEXT = "long-context"  # attnlab long-context's JSON: the frontier's quality axis
REPORT_JSON = "results.json"  # what build_report writes; never read back as an input


@dataclasses.dataclass
class ReportInputs:
    """Everything :func:`collect` found. ``runs``: trained models; ``students``: distilled
    runs ``(name, summary)``; ``step_times``: ``train`` bench records (one file); ``scaling``:
    length-scaling records by bench name; ``other``: any other bench records; ``machines``:
    the machine of each bench file, by path; ``demo``: the demo's own record."""

    runs: list[RunCurves] = dataclasses.field(default_factory=list)
    students: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    step_times: list[Record] = dataclasses.field(default_factory=list)
    scaling: dict[str, list[Record]] = dataclasses.field(default_factory=dict)
    other: list[Record] = dataclasses.field(default_factory=list)
    machines: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    demo: dict[str, Any] | None = None
    long_context: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sources: list[str] = dataclasses.field(default_factory=list)


def collect(paths: Iterable[str | os.PathLike[str]]) -> ReportInputs:
    """Read every input (module docstring). Raises ``FileNotFoundError`` for a missing path
    and ``ValueError`` for a file that is none of the known kinds, for two bench files of the
    same kind (their ratios would mix two runs), or when nothing was found."""
    found = ReportInputs()
    paths = [Path(p) for p in paths]
    for path in paths:
        _collect_one(path, found)
    if not found.sources:
        raise ValueError(f"no run folders or bench JSON files in {', '.join(map(str, paths))}")
    return found


def _collect_one(path: Path, found: ReportInputs, depth: int = 0) -> None:
    """Read ``path`` into ``found``. A folder's entries are read up to two levels down
    (``demo/runs/<run>``), where files of other kinds are passed over; a path given
    explicitly (``depth`` 0) must be of a known kind."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_dir():
        if (path / "summary.json").is_file():
            found.sources.append(str(path))
            if (path / "distill.yaml").is_file():
                found.students.append((path.name, json.loads((path / "summary.json").read_text())))
            else:
                found.runs.append(read_run(path))
        elif depth < 2:
            for child in sorted(path.iterdir()):
                if child.is_dir() or child.suffix == ".json" and child.name != REPORT_JSON:
                    _collect_one(child, found, depth + 1)
        return
    if path.suffix != ".json":
        raise ValueError(f"{path}: not a bench JSON file, demo.json or run folder")
    payload = json.loads(path.read_text())
    if isinstance(payload, dict) and set(payload) == {"demo"}:
        found.demo = payload["demo"]
    elif isinstance(payload, dict) and payload.get("bench") == LONG_CONTEXT:
        found.long_context.append(payload)
    elif isinstance(payload, dict) and "machine" in payload and "results" in payload:
        machine, records = read_json(path)
        found.machines[str(path)] = machine
        for kind in dict.fromkeys(r.bench for r in records):
            mine = [r for r in records if r.bench == kind]
            if kind == STEP_BENCH:
                _only_once(found.step_times, kind, path)
                found.step_times = mine
            elif kind in SCALING_BENCHES:
                _only_once(found.scaling.get(kind), kind, path)
                found.scaling[kind] = mine
            else:
                found.other.extend(mine)
    elif depth == 0:
        raise ValueError(f"{path}: not a bench JSON file, demo.json or run folder")
    else:
        return
    found.sources.append(str(path))


def _only_once(existing: list[Record] | None, kind: str, path: Path) -> None:
    if existing:
        raise ValueError(f"{path}: a second set of {kind!r} bench records; ratios are only "
                         "taken within one run, so give one file per kind")


# ---------------------------------------------------------------- derived figures


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


# ---------------------------------------------------------------- figures


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


# ---------------------------------------------------------------- tables


def _fmt(value: Any, spec: str = ".3f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def headline_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown of :func:`headline` rows."""
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
            f"| {r['model']} | {_fmt(r['params'], ',')} | {_fmt(r['tokens'], ',')} | "
            f"{_fmt(r['final'])} | {_fmt(r['step_ms'], '.0f')} | {_fmt(r['step_ratio'], '.2f')} "
            f"| {_fmt(r['train_s'], '.1f')} | {_fmt(r['reach_s'], '.1f', 'not reached')} | "
            f"{_fmt(r['reach_ratio'], '.2f')} | {_fmt(r['step_peak_mib'], '.0f')} | "
            f"{_fmt(r['train_s_own'], '.1f')} |")
    note = ("Step ms: one training step (forward, backward, optimizer) measured side by side "
            "with the other models in one process (alternating repetitions, median of at least "
            "5, warm-up excluded); training s = steps x step ms, and s to the baseline's final "
            "quality likewise (interpolated between evaluations). Own run s: the summed step "
            "times each training run measured for itself, one run after the other, shown for "
            "reference only (load on the machine may differ between runs)." if side else
            "Some runs have no side-by-side step time: their training s is their own measured "
            "time (separate runs: not comparable as a ratio).")
    return "\n".join(lines) + "\n\n" + note


def students_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown of :func:`students` rows."""
    lines = ["| student | teacher | distillation steps | teacher ppl | student ppl | x teacher "
             "| teacher bpc | student bpc | train step ms | x teacher's |", "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['student']} | {r['teacher']} | {r['steps']} | {_fmt(r['teacher_ppl'])} | "
            f"{_fmt(r['student_ppl'])} | {_fmt(r['ppl_ratio'], '.2f')} | "
            f"{_fmt(r['teacher_bpc'])} | {_fmt(r['student_bpc'])} | "
            f"{_fmt(r['step_ms'], '.0f')} | {_fmt(r['step_ratio'], '.2f')} |")
    return "\n".join(lines)


def sea_grid_table(name: str, summary: Mapping[str, Any]) -> str:
    """Markdown: the student's perplexity (bpc) at each dynamic k (rows) and query skip."""
    grid = summary["inference"]
    skips = sorted({g["query_skip"] for g in grid})
    ks = sorted({g["k"] for g in grid})
    cell = {(g["k"], g["query_skip"]): g for g in grid}
    lines = [f"| {name}: k \\ query skip | " + " | ".join(map(str, skips)) + " |",
             "|" + "---|" * (len(skips) + 1)]
    for k in ks:
        cells = [f"{cell[k, s]['ppl']:.3f} ({cell[k, s]['bpc']:.3f})" if (k, s) in cell else ""
                 for s in skips]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
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
    keys = ("cpu", "threads", "gpu", "torch", "malloc_tuned")
    return ("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n| "
            + " | ".join(str(machine.get(k)) for k in keys) + " |")


# ---------------------------------------------------------------- the report


HOW_TO_READ = {
    "quality": (
        "Left: held-out quality against training tokens (same data, same order for every "
        "model: equal tokens = equal work on the data). Right: the same points against "
        "training wall-clock time; lower and further left is better. A curve that is lower at "
        "the same time is the better model per second of training on this machine. Each "
        "curve's last point is the final evaluation, on more held-out tokens than the others "
        "(hence the small drop at the same step)."),
    "scaling": (
        "Time (left) and peak memory (right) of one forward call against sequence length, "
        "log-log: a slope of 1 is linear, 2 quadratic. Lines that cross show the length from "
        "which one mechanism overtakes another."),
    "macs": (
        "Forward MACs against measured time (log axes where the values span a decade). Points "
        "on the dotted line run at the baseline's rate; points above it lose more time than "
        "their MAC count suggests (memory traffic, gathers, small matmuls), points below "
        "gain more."),
    "sea": (
        "SEA's perplexity when its key budget k (trained at the middle value) or its query "
        "skip is changed at inference, without retraining; the dashed line is the dense "
        "teacher. Lower k and higher skip are cheaper."),
}


def build_report(
    inputs: ReportInputs,
    out_dir: str | os.PathLike[str],
    title: str = "attnlab report",
) -> dict[str, Any]:
    """Write ``report.md``, the PNG figures (with matplotlib; skipped with a warning
    otherwise) and ``results.json`` into ``out_dir``; returns the results dict."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    order = {r.name: i for i, r in enumerate(inputs.step_times)}  # the baseline first
    inputs = dataclasses.replace(inputs, runs=sorted(
        inputs.runs, key=lambda r: order.get(r.name, len(order))))
    machine = next(iter(inputs.machines.values()), None) or machine_info()
    rows = headline(inputs)
    student_rows = students(inputs)
    mac_rows = macs_rows(inputs)
    sea = [(n, s) for n, s in inputs.students if s.get("inference")]
    results: dict[str, Any] = {
        "machine": machine, "machines": inputs.machines, "sources": inputs.sources,
        "demo": inputs.demo, "headline": rows, "students": student_rows,
        "sea_grid": {n: s["inference"] for n, s in sea},
        "step_times": [r.to_json() for r in inputs.step_times],
        "scaling": {b: {"records": [r.to_json() for r in rs], "summary": summarize(rs),
                        "crossovers": crossovers(rs)} for b, rs in inputs.scaling.items()},
        "macs": mac_rows, "other_bench": [r.to_json() for r in inputs.other],
        "runs": {r.name: {"summary": r.summary, "metric": r.metric, "eval_curve": r.eval_curve,
                          "train_time": r.train_time} for r in inputs.runs},
        "students_summary": dict(inputs.students), "figures": {},
    }
    label = machine_label(machine)
    md = [f"# {title}", "", f"Measured on: {label}.", ""]
    if inputs.demo:
        d = inputs.demo
        md += [f"`attnlab demo` ({d.get('mode')}): budget {d.get('budget_s', 0) / 60:.1f} min, "
               f"this invocation took {d.get('wall_s', 0) / 60:.1f} min; stages (s): "
               + ", ".join(f"{k} {v:.0f}" for k, v in d.get("stages_s", {}).items()) + ".", ""]
        if d.get("load_avg"):
            md += [f"Load on the machine (1-minute load average, {d.get('cpus')} CPUs) at the "
                   f"start and end: {d['load_avg'][0]:.1f} and {d['load_avg'][1]:.1f}. Other "
                   "processes slow every candidate of a side-by-side measurement alike, but "
                   "they cut the steps the budget allows.", ""]
        md += [d["notes"], ""] if d.get("notes") else []

    figures: dict[str, str] = results["figures"]

    def figure(key: str, name: str, draw) -> str | None:
        try:
            figures[key] = draw(out / name).name
        except ImportError as err:
            logger.warning("no %s figure: %s", key, err)
        return figures.get(key)

    if rows:
        side = {r["model"]: r["step_ms"] / 1e3 for r in rows if r["step_ms"] is not None}
        md += ["## Is it faster in wall-clock, and at what quality?", "", headline_table(rows),
               "", curves_table(inputs.runs), ""]
        figure("quality", "quality.png", lambda p: plot_quality(
            inputs.runs, p, side,
            f"held-out quality of models trained on the same tokens\n{label}"))
        if "quality" in figures:
            md += [f"![quality]({figures['quality']})", "", HOW_TO_READ["quality"], ""]
    if student_rows:
        md += ["## Distilled students (SEA, Performer) against their dense teacher", "",
               students_table(student_rows), "",
               "Teacher and student are evaluated on the same held-out tokens at the same "
               "context; x teacher is the perplexity ratio (1 = no loss).", ""]
    if sea:
        md += ["### SEA at other key budgets and query skips, without retraining", "",
               "Perplexity (bits per character) per setting:", ""]
        md += [sea_grid_table(n, s) + "\n" for n, s in sea]
        figure("sea", "sea-dynamic-k.png", lambda p: plot_sea_grid(
            sea, p, f"SEA's perplexity against dynamic k and query skip\n{label}"))
        if "sea" in figures:
            md += [f"![SEA dynamic k]({figures['sea']})", "", HOW_TO_READ["sea"], ""]
    for bench, records in inputs.scaling.items():
        what = "whole attention layers" if bench == "attention-layer" else "attention cores"
        key = f"scaling-{bench}"
        md += [f"## Attention time and memory against sequence length ({what})", "",
               format_summary(records), "",
               crossover_lines(results["scaling"][bench]["crossovers"]), ""]
        figure(key, f"{key}.png", lambda p, rs=records, w=what: plot_scaling(
            rs, p, xlabel="sequence length (tokens)",
            title=f"{w}, forward, batch {rs[0].shape['batch']}: time and peak memory\n{label}"))
        if key in figures:
            md += [f"![{key}]({figures[key]})", "", HOW_TO_READ["scaling"], ""]
    if mac_rows:
        md += ["## MACs against measured time", "",
               "| what | name | seq_len | forward MMACs | ms | x baseline |", "|" + "---|" * 6]
        md += [f"| {r['what']} | {r['name']} | {_fmt(r['seq_len'], 'd')} | "
               f"{r['macs'] / 1e6:,.1f} | {r['ms']:.2f} | {_fmt(r['ratio'], '.2f')} |"
               for r in mac_rows]
        md.append("")
        figure("macs", "macs-vs-time.png", lambda p: plot_macs(
            mac_rows, p, f"MACs against measured time\n{label}"))
        if "macs" in figures:
            md += [f"![MACs]({figures['macs']})", "", HOW_TO_READ["macs"], ""]
    if inputs.long_context:
        serve = [r for r in inputs.other if r.bench == "serve"]
        lines, results["frontier"] = frontier.report_section(inputs.long_context, serve,
                                                             figure, label)
        md += lines
    if inputs.other:
        md += ["## Other benchmarks", "", format_table(inputs.other), ""]
    md += ["## Machine", "", machine_table(machine), "",
           "Sources (relative to this report): "
           + ", ".join(f"`{os.path.relpath(s, out)}`" for s in inputs.sources), ""]
    atomic_write_text(out / "report.md", "\n".join(md))
    atomic_write_json(out / REPORT_JSON, _finite(results))
    return results


def _finite(obj: Any) -> Any:
    """``obj`` with non-finite floats as None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


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
        lines += [f"| {r['model']} | {_fmt(r['final'])} | {_fmt(r['step_ratio'], '.2f')} | "
                  f"{_fmt(r['reach_ratio'], '.2f', 'not reached' if r['reach_s'] is None else '-')}"
                  " |" for r in results["headline"]]
        blocks.append("\n".join(lines))
    if results["students"]:
        lines = ["| student | ppl | teacher ppl | x teacher |", "|---|---|---|---|"]
        lines += [f"| {r['student']} | {_fmt(r['student_ppl'])} | {_fmt(r['teacher_ppl'])} | "
                  f"{_fmt(r['ppl_ratio'], '.2f')} |" for r in results["students"]]
        blocks.append("\n".join(lines))
    for bench, s in results["scaling"].items():
        lines = [f"| {bench} | faster than baseline from T = | best time ratio (at T) |",
                 "|---|---|---|"]
        lines += [f"| {name} | {c['faster_from'] or 'never'} | {c['best_ratio']:.2f} "
                  f"({c['best_at']}) |" for name, c in s["crossovers"].items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
