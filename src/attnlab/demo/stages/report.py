"""Stage 6, the report: what ``attnlab demo`` says about its run (the figures below their
stage's minimum, the notes on how the models compare and how they trained), ``demo.json``
(budget, stage times, minimums, shortfalls, decisions, notes), then ``report.md``, the PNGs
and ``results.json`` (:func:`attnlab.report.build_report`)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from attnlab.demo.plan import LAYERS, STUDENTS, TRAINED
from attnlab.demo.stages.base import Stage
from attnlab.report import build_report, collect
from attnlab.results import read_json
from attnlab.utils.io import atomic_write_json

if TYPE_CHECKING:
    from attnlab.demo.context import Demo

logger = logging.getLogger(__name__)

NOTES = (
    "How the models compare: dense-h8 (8 heads), dense-h2 (2 heads) and switchhead (2 heads "
    "x 4 value/output experts, k=2) are parameter-matched and use Transformer-XL positions "
    "with one memory chunk, as in the SwitchHead paper, and train on the same tokens in the "
    "same order. SEA and Performer cannot take XL's position bias, so they are distilled from "
    "dense-h8-rope (the same 8 x 16 heads with RoPE and 256-token sequences, trained on as "
    "many tokens) and judged only against it. The length benchmark builds every mechanism "
    "as an attention layer of dense-h8-rope's shape (SwitchHead with RoPE); its SEA, "
    "Performer and Reformer are untrained (speed and memory do not depend on the weights).")


def shortfalls(demo: Demo, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures below their stage's minimum: ``{"stage", "names", "reason"}`` each."""
    s, found = demo.scale, []
    if plan["train_tokens"] < s.min_train_tokens:
        found.append({"stage": "training", "names": list(TRAINED), "reason": (
            f"each model trained on {plan['train_tokens']:,} tokens, below the "
            f"{s.min_train_tokens:,} a comparison of architectures needs")})
    steps = plan.get("distill_steps", 0)
    for name in STUDENTS:
        if steps < s.min_distill_steps:
            reason = (f"{name} distilled {steps} steps, below the {s.min_distill_steps} "
                      "needed for its perplexity to converge")
        elif name in s.unconverged:
            reason = (f"{name} had not converged after {steps} steps ({s.unconverged[name]}): "
                      "its ratio is where it stands, not where it ends")
        else:
            continue
        found.append({"stage": "distillation", "names": [name], "reason": reason})
    _, records = read_json(demo.out / "bench-attention-layers.json")
    reached = max((r.shape["seq_len"] for r in records if r.ms_median is not None),
                  default=0)
    if reached < s.bench_min_len(demo.cuda):
        found.append({"stage": "benchmark", "names": list(LAYERS), "reason": (
            f"the length benchmark reached {reached} tokens, below the "
            f"{s.bench_min_len(demo.cuda)} where the mechanisms' curves cross")})
    for f in found:
        logger.warning("demo: inconclusive: %s", f["reason"])
    return found


def write_report(demo: Demo, plan: dict[str, Any]) -> dict[str, Any]:
    """``demo.json``, then the report of every stage's results."""
    s, budget = demo.scale, demo.budget
    record = {
        "mode": s.name, "budget_s": budget.budget_s, "wall_s": budget.elapsed(),
        "stages_s": budget.stages_s, "runs_s": budget.runs_s, "planned_s": budget.planned_s,
        "train_jobs": plan.get("train_jobs", 1), "train_threads": plan.get("train_threads"),
        "device": demo.device, "cpus": os.cpu_count(),
        "load_avg": [demo.load_start, os.getloadavg()[0]], "strict_budget": budget.strict,
        "precision": demo.precision,
        "minimums": {"train_tokens": s.min_train_tokens, "distill_steps": s.min_distill_steps,
                     "bench_seq_len": s.bench_min_len(demo.cuda)},
        "decisions": plan.get("decisions", []), "shortfalls": shortfalls(demo, plan),
        "real_model": demo.real.name if demo.real else None,
        "notes": " ".join([NOTES, training_note(demo, plan), demo.real_note]).replace("  ", " "),
    }
    atomic_write_json(demo.out / "demo.json", {"demo": record})
    inputs = collect([demo.out / "probe.json", *[demo.out / "runs" / n for n in TRAINED],
                      *[demo.out / "runs" / n for n in STUDENTS],
                      demo.out / "bench-attention-layers.json", demo.out / "demo.json",
                      *(demo.real.outputs(demo.out) if demo.real else [])])
    return build_report(inputs, demo.out, title="attnlab demo: is it faster in wall-clock, "
                                                "and at what quality?")


def training_note(demo: Demo, plan: dict[str, Any]) -> str:
    """How the four models trained: precision, and how many at once (and why)."""
    note = ("The four models train under bfloat16 autocast (this device computes bf16 "
            "natively); the distillation and the benchmark run in float32." if demo.bf16
            else "")
    choice = plan.get("lanes_choice") or {}
    if plan.get("train_jobs", 1) > 1:
        note += (f" They train {plan['train_jobs']} at a time, each in its own process on "
                 f"{plan['train_threads']} thread(s): a second probe timed them that way and "
                 f"predicted 100 steps of every model in "
                 f"{choice.get('together_s_per_100_steps', 0):.0f} s, against "
                 f"{choice.get('alone_s_per_100_steps', 0):.0f} s one at a time on every "
                 "thread. The step times this report compares come from the first probe: "
                 "every model alone on every thread, side by side.")
    elif choice:
        note += (f" They train one at a time: a second probe timed them two or more at once "
                 f"and predicted 100 steps of every model in "
                 f"{choice['together_s_per_100_steps']:.0f} s that way, against "
                 f"{choice['alone_s_per_100_steps']:.0f} s one at a time.")
    if replanned := plan.get("replanned"):
        note += (f" The training steps were re-planned after the first {replanned['at_step']} "
                 f"steps of {', '.join(replanned['measured_step_s'])}, which ran at "
                 f"x{replanned['pace']:.2f} the probe's pace: {replanned['probe_steps']} "
                 f"steps planned from the probe, {plan['train_steps']} trained.")
    return note


class ReportStage(Stage):
    """``demo.json`` and the report, written again by every invocation (from what every stage
    left in ``out``); it keeps ``report_reserve_s`` of the budget."""

    name = "report"

    def minimum_s(self) -> float:
        """The time kept for the report (``report_reserve_s``)."""
        return self.demo.scale.report_reserve_s

    def run(self, part: str) -> dict[str, Any]:
        """The report's results dict."""
        return write_report(self.demo, self.demo.plan)
