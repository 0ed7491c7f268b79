"""``attnlab demo``: every stage of the main job, resumable, within a time budget.

Stages, each leaving its result in ``out`` (atomically, so an interrupted demo re-run picks
up finished stages and resumes a half-done run from its last checkpoint):

1. ``probe.json``: one training step of every model, side by side (bench JSON);
2. ``plan.json``: the steps the budget allows (training; distillation once it starts), and
   every decision taken when the measured pace could not cover a stage's minimum;
3. ``runs/<model>/``: each model of :data:`~attnlab.demo.plan.TRAINED` trained on the same
   tokens (``attnlab train`` run folders);
4. ``runs/<student>/``: SEA and Performer distilled from the RoPE teacher
   (``attnlab distill`` run folders);
5. ``bench-attention-layers.json``: attention layers against sequence length (bench JSON);
6. ``demo.json`` (budget, stage times, minimums, shortfalls, decisions, notes), then
   ``report.md``, the PNGs and ``results.json`` (:func:`attnlab.report.build_report`).

Validity first, budget second. Every stage has a minimum (:class:`~attnlab.demo.plan.Scale`).
After every stage the demo compares the time it took with the time planned for it and
re-plans the rest at the pace measured. When the rest cannot reach its minimums in the time
left, it says so, and by default keeps every minimum and goes over the budget by the stated
amount; with ``strict_budget`` it keeps the budget, and a stage that falls below its minimum
is reported inconclusive, with the reason, in ``report.md``, ``results.json`` and the
terminal summary. Either way, no figure is silently below its minimum.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from attnlab.bench import train_step
from attnlab.bench.attention import run_layers
from attnlab.bench.common import read_json
from attnlab.config import builtin_config
from attnlab.demo.budget import Budget
from attnlab.demo.plan import (
    BASELINE,
    BUDGET_MINUTES,
    LAYERS,
    PRECISIONS,
    SCALES,
    SPEED_PROBE,
    STUDENTS,
    TEACHER,
    TRAINED,
    DistillCost,
    Scale,
    bench_min_seconds,
    distill_seconds,
    plan_distill_steps,
    plan_train_steps,
    train_seconds,
)
from attnlab.distill import DistillRunConfig, distill, load_distill_config
from attnlab.report import build_report, collect
from attnlab.train import RunDirError, load_run_config, train
from attnlab.train.config import RunConfig
from attnlab.utils.io import atomic_write_json
from attnlab.utils.precision import native_bf16

logger = logging.getLogger(__name__)

SEA_GRID_KS = 3  # distill's default dynamic k: k/2, k, 2k
NOTES = (
    "How the models compare: dense-h8 (8 heads), dense-h2 (2 heads) and switchhead (2 heads "
    "x 4 value/output experts, k=2) are parameter-matched and use Transformer-XL positions "
    "with one memory chunk, as in the SwitchHead paper, and train on the same tokens in the "
    "same order. SEA and Performer cannot take XL's position bias, so they are distilled from "
    "dense-h8-rope (the same 8 x 16 heads with RoPE and 256-token sequences, trained on as "
    "many tokens) and judged only against it. The length benchmark builds every mechanism "
    "as an attention layer of dense-h8-rope's shape (SwitchHead with RoPE); its SEA, "
    "Performer and Reformer are untrained (speed and memory do not depend on the weights).")

BF16_NOTE = (" The four models train under bfloat16 autocast (this device computes bf16 "
             "natively); the distillation and the benchmark run in float32.")


class Demo:
    """One invocation of the demo in ``out``, timed by ``budget``."""

    def __init__(self, out: Path, scale: Scale, budget: Budget, device: str,
                 progress: bool, precision: str = "auto") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, "
                             f"got {precision!r}")
        self.out, self.scale, self.budget, self.progress = out, scale, budget, progress
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" \
            else device
        self.cuda = self.device.startswith("cuda")
        self.bf16 = precision == "bf16" or (precision == "auto" and native_bf16(self.device))
        self.precision = "bf16" if self.bf16 else "fp32"
        self.load_start = os.getloadavg()[0]

    def config(self, source: str, overrides: tuple[str, ...] = ()) -> RunConfig:
        """A built-in config with the scale's and the given overrides, on the demo's device."""
        return load_run_config(builtin_config(source), [
            *self.scale.overrides, *overrides, f"train.device={self.device}"])

    def trained_config(self, name: str, overrides: tuple[str, ...] = ()) -> RunConfig:
        """The config model ``name`` of :data:`TRAINED` trains with (bf16 autocast if the
        demo trains in bf16; distillation and the benchmark stay in float32)."""
        return self.config(TRAINED[name], (f"train.bf16={str(self.bf16).lower()}", *overrides))

    def check_the_rest(self, plan: dict[str, Any], rest_s: float, what: str) -> None:
        """After a stage: if the rest (``rest_s`` at the measured pace) no longer fits, say
        what the demo does about it now, and keep it in ``plan.json`` for the report."""
        decision = self.budget.overrun(rest_s, what)
        if decision is not None:
            logger.warning("demo: %s", decision)
            plan.setdefault("decisions", []).append(decision)
            atomic_write_json(self.out / "plan.json", plan)

    # ------------------------------------------------------------ stages

    def probe(self) -> dict[str, float]:
        """Seconds per training step of every model and student architecture, side by side:
        the midpoint of each one's median and fastest probed step. On the reference machine
        the median overestimated the pace of the training that followed by up to 15% and the
        fastest step underestimated it by up to 9%, the midpoint was within 5% (dense-h8's
        probe in three demos: median 217 / 259 / 287 ms, fastest 205 / 244 / 218, its run's
        steps 223 / 246 / 248)."""
        path = self.out / "probe.json"
        if not path.is_file():
            cfgs = {**{name: self.trained_config(name) for name in TRAINED},
                    **{name: self.config(src) for name, src in STUDENTS.items()}}
            train_step.run_configs(cfgs, steps=self.scale.probe_reps, json_path=path,
                                   device=self.device)
        else:
            logger.info("probe: finished earlier, reusing %s", path)
        _, records = read_json(path)
        return {r.name: (r.ms_median + r.ms_min) / 2e3 for r in records}

    def later_minimum_s(self, step_s: dict[str, float]) -> float:
        """Seconds the stages after training need at their minimums (at the probe's pace)."""
        return (distill_seconds(self.distill_cost(step_s), self.scale.min_distill_steps)
                + self.bench_min_s(step_s) + self.scale.report_reserve_s)

    def bench_min_s(self, step_s: dict[str, float]) -> float:
        return bench_min_seconds(self.scale, step_s[SPEED_PROBE], self.cuda)

    def plan(self, step_s: dict[str, float]) -> dict[str, Any]:
        """The training steps (planned once, kept in ``plan.json``): the minimum, plus
        ``train_share`` of what the budget leaves beyond every stage's minimum and the
        benchmark's share; under the minimum only with ``strict_budget``."""
        path = self.out / "plan.json"
        tokens = self._tokens_per_step(self.config(TRAINED[BASELINE]))
        trained = {n: step_s[n] for n in TRAINED}
        if path.is_file():
            plan = json.loads(path.read_text())
            if plan["scale"] != self.scale.name:
                raise RunDirError(f"{self.out} holds a {plan['scale']} demo; finish it with "
                                  f"that mode or give another --out")
            if plan.get("precision", "fp32") != self.precision:
                raise RunDirError(f"{self.out} holds a demo trained in {plan.get('precision')};"
                                  f" finish it with --precision {plan.get('precision')} or "
                                  "give another --out")
        else:
            s, left = self.scale, self.budget.remaining()
            min_steps = s.min_train_steps(tokens)
            train_min_s = train_seconds(trained, min_steps, s, tokens)
            needed = train_min_s + self.later_minimum_s(step_s)
            spare = left - needed - s.bench_share * self.budget.budget_s
            seconds = train_min_s + s.train_share * max(0.0, spare)
            if needed > left and self.budget.strict:
                seconds = train_min_s * max(0.0, left) / needed  # every stage cut alike
            steps = plan_train_steps(trained, seconds, s, tokens,
                                     floor=1 if self.budget.strict else min_steps)
            plan = {"scale": s.name, "budget_s": self.budget.budget_s, "train_steps": steps,
                    "train_tokens": steps * tokens, "strict_budget": self.budget.strict,
                    "precision": self.precision}
            logger.info("plan: %d training steps (%d tokens) per model in ~%.0f s; every "
                        "stage at its minimum needs ~%.0f s of the %.0f s left", steps,
                        steps * tokens, seconds, needed, left)
            atomic_write_json(path, plan)
            self.check_the_rest(plan, needed, "the stages at their minimums")
        for name in TRAINED:
            self.budget.planned_s[name] = train_seconds({name: step_s[name]},
                                                        plan["train_steps"], self.scale, tokens)
        return plan

    def replan_after_training(self, plan: dict[str, Any], step_s: dict[str, float],
                              done: str) -> None:
        """After training ``done``: the rest of training (its steps are fixed: every model
        sees the same tokens) and the later stages at their minimums, at the measured pace."""
        names = list(TRAINED)
        rest = names[names.index(done) + 1:]
        rest_s = self.budget.pace() * (sum(self.budget.planned_s[n] for n in rest)
                                       + self.later_minimum_s(step_s))
        self.check_the_rest(plan, rest_s, f"training {', '.join(rest)} and the later stages"
                            if rest else "the distillation and the benchmark")

    def distill_cost(self, step_s: dict[str, float], pace: float = 1.0,
                     names: tuple[str, ...] = tuple(STUDENTS)) -> DistillCost:
        """What distilling ``names`` costs, at ``pace`` times the probed step times."""
        d = self.distill_config("sea", 1).distill
        tokens = d.batch_size * (d.seq_len or self.config(TRAINED[TEACHER]).train.seq_len)
        grid = {"sea": SEA_GRID_KS * len(d.query_skip)}
        return DistillCost({n: pace * step_s[n] for n in names}, pace * step_s[TEACHER],
                           tokens, d.eval_tokens, d.final_eval_tokens or d.eval_tokens, grid)

    def plan_distill(self, plan: dict[str, Any], step_s: dict[str, float]) -> int:
        """The distillation steps, planned once training is done at the pace it measured
        (added to ``plan.json``): what the time left after the benchmark's share allows,
        never below the minimum unless ``strict_budget``."""
        pace, s = self.budget.pace(), self.scale
        if "distill_steps" not in plan:
            bench_s = max(pace * self.bench_min_s(step_s), s.bench_share * self.budget.budget_s)
            seconds = max(0.0, self.budget.remaining() - bench_s - s.report_reserve_s)
            steps = plan_distill_steps(self.distill_cost(step_s, pace), seconds, s,
                                       floor=1 if self.budget.strict else s.min_distill_steps)
            plan["distill_steps"] = steps
            logger.info("plan: %d distillation steps per student in ~%.0f s (pace x%.2f the "
                        "probe's)", steps, seconds, pace)
            atomic_write_json(self.out / "plan.json", plan)
            rest = (distill_seconds(self.distill_cost(step_s, pace), steps)
                    + pace * self.bench_min_s(step_s) + s.report_reserve_s)
            self.check_the_rest(plan, rest, "the distillation and the benchmark")
        for name in STUDENTS:
            self.budget.planned_s[name] = distill_seconds(
                self.distill_cost(step_s, names=(name,)), plan["distill_steps"])
        return plan["distill_steps"]

    def _finished(self, name: str, run_dir: Path) -> bool:
        """Whether run ``name`` finished in an earlier invocation (then it is reused)."""
        if not (run_dir / "summary.json").is_file():
            return False
        logger.info("%s: finished earlier, reusing %s", name, run_dir)
        self.budget.planned_s.pop(name, None)  # says nothing of the pace
        return True

    def train_model(self, name: str, steps: int) -> None:
        """Train model ``name`` for ``steps`` (resume a started run, reuse a finished one)."""
        run_dir = self.out / "runs" / name
        if self._finished(name, run_dir):
            return
        resume = (run_dir / "config.yaml").is_file()
        if resume:
            self.budget.planned_s.pop(name, None)  # a part of the run says nothing of the pace
            cfg = load_run_config(run_dir / "config.yaml")
        else:
            s = self.scale
            every = max(1, steps // s.evals)
            warmup = min(self.trained_config(name).train.warmup_steps, max(1, steps // 10))
            cfg = self.trained_config(name, (
                f"train.steps={steps}", f"train.eval_every={every}",
                f"train.ckpt_every={every}", f"train.warmup_steps={warmup}",
                f"train.eval_tokens={s.eval_tokens}",
                f"train.final_eval_tokens={s.final_eval_tokens}",
                f"train.log_every={max(1, min(10, every // 2))}"))
        train(cfg, run_dir, resume=resume, progress=self.progress)

    def distill_config(self, name: str, steps: int) -> DistillRunConfig:
        """Distillation of student ``name`` from the teacher run, ``steps`` steps."""
        core = self.config(STUDENTS[name]).model.attention.core
        base = {"distill": {
            "teacher": str(self.out / "runs" / TEACHER), "student_attention": core.to_yaml(),
            "steps": steps, "ckpt_every": max(1, steps // 4),
            "log_every": max(1, min(10, steps // 4)), "device": self.device}}
        return load_distill_config(base=base, overrides=self.scale.distill)

    def distill_student(self, name: str, steps: int) -> None:
        """Distil student ``name`` (resume a started run, reuse a finished one)."""
        run_dir = self.out / "runs" / name
        if self._finished(name, run_dir):
            return
        resume = (run_dir / "distill.yaml").is_file()
        if resume:
            self.budget.planned_s.pop(name, None)  # a part of the run says nothing of the pace
        cfg = (load_distill_config(run_dir / "distill.yaml") if resume
               else self.distill_config(name, steps))
        distill(cfg, run_dir, resume=resume, progress=self.progress)

    def bench(self) -> None:
        """Attention layers against length: up to the minimum length whatever the time (unless
        ``strict_budget``), longer within the benchmark's share of the budget."""
        path = self.out / "bench-attention-layers.json"
        if path.is_file():
            logger.info("benchmark: finished earlier, reusing %s", path)
            return
        models = {name: load_run_config(builtin_config(src), overrides).model
                  for name, (src, overrides) in LAYERS.items()}
        seconds = min(self.scale.bench_share * self.budget.budget_s,
                      self.budget.remaining() - self.scale.report_reserve_s)
        cuda, s = self.cuda, self.scale
        run_layers(models, s.gpu_seq_lens if cuda else s.seq_lens, reps=s.reps,
                   max_mem_gb=None if cuda else s.cpu_max_mem_gb,
                   time_budget_s=max(seconds, 1.0),
                   min_seq_len=0 if self.budget.strict else s.bench_min_len(cuda),
                   json_path=path, device=self.device)

    def shortfalls(self, plan: dict[str, Any]) -> list[dict[str, Any]]:
        """The figures below their stage's minimum: ``{"stage", "names", "reason"}`` each."""
        s, found = self.scale, []
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
        _, records = read_json(self.out / "bench-attention-layers.json")
        reached = max((r.shape["seq_len"] for r in records if r.ms_median is not None),
                      default=0)
        if reached < s.bench_min_len(self.cuda):
            found.append({"stage": "benchmark", "names": list(LAYERS), "reason": (
                f"the length benchmark reached {reached} tokens, below the "
                f"{s.bench_min_len(self.cuda)} where the mechanisms' curves cross")})
        for f in found:
            logger.warning("demo: inconclusive: %s", f["reason"])
        return found

    def report(self, plan: dict[str, Any]) -> dict[str, Any]:
        """``demo.json``, then the report of every stage's results."""
        s = self.scale
        demo = {"mode": s.name, "budget_s": self.budget.budget_s,
                "wall_s": self.budget.elapsed(), "stages_s": self.budget.stages_s,
                "planned_s": self.budget.planned_s, "device": self.device, "cpus": os.cpu_count(),
                "load_avg": [self.load_start, os.getloadavg()[0]],
                "strict_budget": self.budget.strict,
                "precision": self.precision,
                "minimums": {"train_tokens": s.min_train_tokens,
                             "distill_steps": s.min_distill_steps,
                             "bench_seq_len": s.bench_min_len(self.cuda)},
                "decisions": plan.get("decisions", []), "shortfalls": self.shortfalls(plan),
                "notes": NOTES + (BF16_NOTE if self.bf16 else "")}
        atomic_write_json(self.out / "demo.json", {"demo": demo})
        inputs = collect([self.out / "probe.json", *[self.out / "runs" / n for n in TRAINED],
                          *[self.out / "runs" / n for n in STUDENTS],
                          self.out / "bench-attention-layers.json", self.out / "demo.json"])
        return build_report(inputs, self.out, title="attnlab demo: is it faster in wall-clock, "
                                                    "and at what quality?")

    @staticmethod
    def _tokens_per_step(cfg: RunConfig) -> int:
        return cfg.train.batch_size * cfg.train.seq_len * cfg.train.grad_accum


def run_demo(out: str | Path, *, budget_minutes: float = BUDGET_MINUTES,
             scale: str = "full", device: str = "auto", progress: bool = True,
             strict_budget: bool = False, precision: str = "auto",
             clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Run (or finish) the demo in ``out``; returns the report's results dict. ``scale``:
    ``full`` or ``smoke`` (:data:`attnlab.demo.plan.SCALES`); ``strict_budget``: keep the
    budget and mark the stages it cuts below their minimum inconclusive (default: keep the
    minimums and go over the budget, saying by how much); ``precision``: how the models train
    (:data:`~attnlab.demo.plan.PRECISIONS`); ``clock``: seconds for the budget
    (tests inject a slow one)."""
    out = Path(out)
    budget = Budget(budget_minutes * 60.0, strict_budget, clock)
    demo = Demo(out, SCALES[scale], budget, device, progress, precision)
    out.mkdir(parents=True, exist_ok=True)
    names = ["probe", *TRAINED, *STUDENTS, "bench", "report"]
    with logging_redirect_tqdm(), tqdm(total=len(names), desc="demo", unit="stage",
                                       disable=not progress, dynamic_ncols=True) as bar:

        def stage(name: str, fn: Callable[[], Any]) -> Any:
            bar.set_postfix_str(name)
            result = budget.timed(name, fn)
            bar.update(1)
            return result

        step_s = stage("probe", demo.probe)
        plan = demo.plan(step_s)
        for name in TRAINED:
            stage(name, lambda n=name: demo.train_model(n, plan["train_steps"]))
            demo.replan_after_training(plan, step_s, name)
        distill_steps = demo.plan_distill(plan, step_s)
        for name in STUDENTS:
            stage(name, lambda n=name: demo.distill_student(n, distill_steps))
        stage("bench", demo.bench)
        return stage("report", lambda: demo.report(plan))
