"""The one-command report: "is it faster in wall-clock, and at what quality?".

:func:`build_report` turns the inputs :func:`attnlab.report.inputs.collect` found into
``report.md``, PNG figures and ``results.json`` (every figure of the tables and plots) in one
folder.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attnlab.report import frontier
from attnlab.report.curves import curves_table, plot_quality
from attnlab.report.figures import (
    crossovers,
    headline,
    macs_rows,
    mark_inconclusive,
    students,
)
from attnlab.report.inputs import REPORT_JSON, SERVE_BENCH, ReportInputs, model_name, model_of
from attnlab.report.plots import plot_macs, plot_sea_costs, plot_sea_grid
from attnlab.report.tables import (
    budget_lines,
    crossover_lines,
    fmt,
    headline_table,
    machine_table,
    sea_grid_table,
    students_table,
)
from attnlab.results import Record, format_table, machine_info
from attnlab.results import serve as serve_report
from attnlab.results.figures import machine_label, plot_scaling
from attnlab.results.scaling import format_summary, summarize
from attnlab.utils.io import atomic_write_json, atomic_write_text

logger = logging.getLogger(__name__)


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
    "convergence": (
        "Each student's held-out quality at every evaluation of its distillation, against the "
        "tokens it was distilled on and against its own training time (each run timed itself, "
        "so times from different runs compare only on a quiet machine). The dense teacher's "
        "value is in the students table above."),
    "sea": (
        "SEA's perplexity when its key budget k (trained at the middle value) or its query "
        "skip is changed at inference, without retraining; the dashed line is the dense "
        "teacher. Lower k and higher skip are cheaper."),
    "sea-costs": (
        "The same settings with what they cost: one forward of a held-out sequence at the "
        "distillation context, each setting and the dense teacher timed alternately in one "
        "run (medians), and the peak memory of one forward; both as multiples of the "
        "teacher's (below 1 is cheaper); lighter cells are better in every panel. At short "
        "contexts the estimator's fixed cost outweighs the saved attention; SEA's case is long "
        "contexts."),
    "serve": (
        "Whole models side by side (`attnlab bench serve`, alternating rounds): cached "
        "decoding in tokens per second from a cache of T tokens, and one prefill of T tokens "
        "in ms, each with its ratio to the original (decode: above 1 is faster; prefill: "
        "below 1 is faster); converted cores are untrained (speed does not depend on the "
        "weights)."),
}


@dataclasses.dataclass
class _Figures:
    """The report's PNG figures, drawn into ``out`` (skipped with a warning without
    matplotlib); ``drawn`` maps a figure's key to its file name."""

    out: Path
    label: str
    drawn: dict[str, str]

    def figure(self, key: str, name: str, draw: Callable[[Path], Path]) -> str | None:
        """Draw ``name`` with ``draw(path)``; its file name, or None when it was skipped."""
        try:
            self.drawn[key] = draw(self.out / name).name
        except ImportError as err:
            logger.warning("no %s figure: %s", key, err)
        return self.drawn.get(key)

    def lines(self, key: str, alt: str, how: str) -> list[str]:
        """The Markdown of figure ``key`` and how to read it, when it was drawn."""
        return [f"![{alt}]({self.drawn[key]})", "", HOW_TO_READ[how], ""] if (
            key in self.drawn) else []


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
    results = _results(inputs, machine)
    figs = _Figures(out, machine_label(machine), results["figures"])
    md = [f"# {title}", "", f"Measured on: {figs.label}.", ""]
    if inputs.demo:
        md += _demo_lines(inputs.demo)
    md += _quality_section(inputs, results["headline"], figs)
    md += _students_section(inputs, results["students"], figs)
    md += _scaling_section(inputs, results, figs)
    md += _macs_section(results["macs"], figs)
    serve = [r for r in inputs.other if r.bench == SERVE_BENCH]
    if inputs.long_context:
        lines, results["frontier"] = frontier.report_section(inputs.long_context, serve,
                                                             figs.figure, figs.label)
        md += lines
    md += _serve_section(serve)
    if other := [r for r in inputs.other if r.bench != SERVE_BENCH]:
        md += ["## Other benchmarks", "", format_table(other), ""]
    md += ["## Machine", "", machine_table(machine), "",
           "Sources (relative to this report): "
           + ", ".join(f"`{os.path.relpath(s, out)}`" for s in inputs.sources), ""]
    atomic_write_text(out / "report.md", "\n".join(md))
    atomic_write_json(out / REPORT_JSON, _finite(results))
    return results


def _results(inputs: ReportInputs, machine: Mapping[str, Any]) -> dict[str, Any]:
    """Every figure of the report's tables (``results.json``); ``figures`` filled later."""
    inconclusive = (inputs.demo or {}).get("shortfalls", [])
    sea = [(n, s) for n, s in inputs.students if s.get("inference")]
    return {
        "machine": machine, "machines": inputs.machines, "sources": inputs.sources,
        "demo": inputs.demo, "inconclusive": inconclusive,
        "headline": mark_inconclusive(headline(inputs), "model", "training", inconclusive),
        "students": mark_inconclusive(students(inputs), "student", "distillation",
                                      inconclusive),
        "sea_grid": {n: s["inference"] for n, s in sea},
        "step_times": [r.to_json() for r in inputs.step_times],
        "scaling": {b: {"records": [r.to_json() for r in rs], "summary": summarize(rs),
                        "crossovers": crossovers(rs)} for b, rs in inputs.scaling.items()},
        "macs": macs_rows(inputs), "other_bench": [r.to_json() for r in inputs.other],
        "runs": {r.name: {"summary": r.summary, "metric": r.metric, "eval_curve": r.eval_curve,
                          "train_time": r.train_time} for r in inputs.runs},
        "students_summary": dict(inputs.students), "figures": {},
    }


def _demo_lines(d: Mapping[str, Any]) -> list[str]:
    """What the demo run was: its budget, stages and runs, the machine's load, its notes and
    the budget's lines."""
    md = [f"`attnlab demo` ({d.get('mode')}): budget {d.get('budget_s', 0) / 60:.1f} min, "
          f"this invocation took {d.get('wall_s', 0) / 60:.1f} min; stages (s): "
          + ", ".join(f"{k} {v:.0f}" for k, v in d.get("stages_s", {}).items()) + "."
          + (f" Training runs (s, {d.get('train_jobs', 1)} at a time): "
             + ", ".join(f"{k} {v:.0f}" for k, v in d["runs_s"].items()) + "."
             if d.get("runs_s") else ""), ""]
    if d.get("load_avg"):
        md += [f"Load on the machine (1-minute load average, {d.get('cpus')} CPUs) at the "
               f"start and end: {d['load_avg'][0]:.1f} and {d['load_avg'][1]:.1f}. Other "
               "processes slow every candidate of a side-by-side measurement alike, but "
               "they cut the steps the budget allows.", ""]
    md += [d["notes"], ""] if d.get("notes") else []
    return md + budget_lines(d)


def _quality_section(inputs: ReportInputs, rows: list[dict[str, Any]],
                     figs: _Figures) -> list[str]:
    """The headline: each trained model's quality, step time and curves."""
    if not rows:
        return []
    side = {r["model"]: r["step_ms"] / 1e3 for r in rows if r["step_ms"] is not None}
    md = ["## Is it faster in wall-clock, and at what quality?", "", headline_table(rows),
          "", curves_table(inputs.runs), ""]
    figs.figure("quality", "quality.png", lambda p: plot_quality(
        inputs.runs, p, side,
        f"held-out quality of models trained on the same tokens\n{figs.label}"))
    return md + figs.lines("quality", "quality", "quality")


def _students_section(inputs: ReportInputs, rows: list[dict[str, Any]],
                      figs: _Figures) -> list[str]:
    """Distilled students against their teacher, their convergence and SEA's settings."""
    md: list[str] = []
    if rows:
        md += ["## Distilled students against their dense teacher", "",
               students_table(rows), "",
               "Teacher and student are evaluated on the same held-out tokens at the same "
               "context; x teacher is the perplexity ratio (1 = no loss).", ""]
    converging = [c for c in inputs.student_curves if c.eval_curve]
    if converging:
        md += ["### Distillation convergence", "", curves_table(converging), ""]
        figs.figure("convergence", "distillation-convergence.png", lambda p: plot_quality(
            converging, p, None,
            f"students' held-out quality during distillation (SEA's Fig. 4b)\n{figs.label}"))
        md += figs.lines("convergence", "distillation convergence", "convergence")
    sea = [(n, s) for n, s in inputs.students if s.get("inference")]
    if not sea:
        return md
    md += ["### SEA at other key budgets and query skips, without retraining", "",
           "Perplexity (bits per character) per setting:", ""]
    md += [sea_grid_table(n, s) + "\n" for n, s in sea]
    figs.figure("sea", "sea-dynamic-k.png", lambda p: plot_sea_grid(
        sea, p, f"SEA's perplexity against dynamic k and query skip\n{figs.label}"))
    md += figs.lines("sea", "SEA dynamic k", "sea")
    costed = [(n, s) for n, s in sea if "inference_teacher" in s]
    if costed:
        figs.figure("sea-costs", "sea-costs.png", lambda p: plot_sea_costs(
            costed, p, f"SEA's settings: quality, time and memory (Table A.6)\n{figs.label}"))
        md += figs.lines("sea-costs", "SEA costs", "sea-costs")
    return md


def _scaling_section(inputs: ReportInputs, results: Mapping[str, Any],
                     figs: _Figures) -> list[str]:
    """Attention time and memory against sequence length, per scaling benchmark."""
    md: list[str] = []
    for bench, records in inputs.scaling.items():
        what = "whole attention layers" if bench == "attention-layer" else "attention cores"
        key = f"scaling-{bench}"
        md += [f"## Attention time and memory against sequence length ({what})", "",
               *[f"**Inconclusive**: {f['reason']}.\n" for f in results["inconclusive"]
                 if f["stage"] == "benchmark"],
               format_summary(records), "",
               crossover_lines(results["scaling"][bench]["crossovers"]), ""]
        figs.figure(key, f"{key}.png", lambda p, rs=records, w=what: plot_scaling(
            rs, p, xlabel="sequence length (tokens)",
            title=f"{w}, forward, batch {rs[0].shape['batch']}: time and peak memory\n"
                  f"{figs.label}"))
        md += figs.lines(key, key, "scaling")
    return md


def _macs_section(rows: list[dict[str, Any]], figs: _Figures) -> list[str]:
    """Forward MACs against measured time."""
    if not rows:
        return []
    md = ["## MACs against measured time", "",
          "| what | name | seq_len | forward MMACs | ms | x baseline |", "|" + "---|" * 6]
    md += [f"| {r['what']} | {r['name']} | {fmt(r['seq_len'], 'd')} | "
           f"{r['macs'] / 1e6:,.1f} | {r['ms']:.2f} | {fmt(r['ratio'], '.2f')} |"
           for r in rows]
    md.append("")
    figs.figure("macs", "macs-vs-time.png", lambda p: plot_macs(
        rows, p, f"MACs against measured time\n{figs.label}"))
    return md + figs.lines("macs", "MACs", "macs")


def _serve_section(serve: list[Record]) -> list[str]:
    """``attnlab bench serve`` tables, one per model."""
    if not serve:
        return []
    md = ["## Serving: prefill and cached decoding", ""]
    for model, fingerprint in dict.fromkeys(map(model_of, serve)):
        md += [f"Model: {model_name(model, fingerprint)}.", "",
               serve_report.format_summary([r for r in serve
                                            if model_of(r) == (model, fingerprint)]), ""]
    return md + [HOW_TO_READ["serve"], ""]


def _finite(obj: Any) -> Any:
    """``obj`` with non-finite floats as None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
