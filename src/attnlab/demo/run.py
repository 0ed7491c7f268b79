"""``attnlab demo``: every stage of the main job, resumable, within a time budget.

Stages, each leaving its result in ``out`` (atomically, so an interrupted demo re-run picks
up finished stages and resumes a half-done run from its last checkpoint):

1. ``probe.json``: one training step of every model, side by side (bench JSON);
2. ``plan.json``: how many models train at once (a second probe), the steps the budget
   allows (training, re-planned once after the first warm-ups; distillation once it starts),
   and every decision taken when the measured pace could not cover a stage's minimum;
3. ``runs/<model>/``: each model of :data:`~attnlab.demo.plan.TRAINED` trained on the same
   tokens (``attnlab train`` run folders); on a CPU several at once, each in its own process
   on its share of the threads, its log in ``runs/<model>.log`` (:mod:`attnlab.demo.parallel`);
4. ``runs/<student>/``: SEA and Performer distilled from the RoPE teacher
   (``attnlab distill`` run folders);
5. ``bench-attention-layers.json``: attention layers against sequence length (bench JSON);
6. with a large enough budget, the real-model stage (:mod:`attnlab.demo.real_model`);
7. ``demo.json`` (budget, stage times, minimums, shortfalls, decisions, notes), then
   ``report.md``, the PNGs and ``results.json`` (:mod:`attnlab.demo.summary`).

Validity first, budget second. Every stage has a minimum (:class:`~attnlab.demo.plan.Scale`).
After every stage the demo compares the time it took with the time planned for it and
re-plans the rest at the pace measured. When the rest cannot reach its minimums in the time
left, it says so, and by default keeps every minimum and goes over the budget by the stated
amount; with ``strict_budget`` it keeps the budget, and a stage that falls below its minimum
is reported inconclusive, with the reason, in ``report.md``, ``results.json`` and the
terminal summary. Either way, no figure is silently below its minimum.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from attnlab.bench import train_step
from attnlab.bench.attention import run_layers
from attnlab.config import ConfigError, builtin_config, dump_yaml
from attnlab.demo.budget import Budget
from attnlab.demo.parallel import Run, measured_step_s, probe_concurrently, train_runs
from attnlab.demo.plan import (
    BASELINE,
    BUDGET_MINUTES,
    LAYERS,
    PRECISIONS,
    REAL_MODEL_CHOICES,
    REAL_MODEL_MINUTES,
    SCALES,
    SPEED_PROBE,
    STUDENTS,
    TEACHER,
    TRAINED,
    DistillCost,
    Lanes,
    Scale,
    bench_min_seconds,
    distill_seconds,
    plan_distill_steps,
    plan_train_steps,
    real_model_seconds,
    train_seconds,
    train_spans,
)
from attnlab.demo.real_model import RealModel
from attnlab.demo.summary import write_report
from attnlab.distill import DistillRunConfig, distill, load_distill_config
from attnlab.results import read_json
from attnlab.train import RunDirError, load_run_config, train
from attnlab.train.config import RunConfig
from attnlab.utils import readers
from attnlab.utils.io import atomic_write_json, atomic_write_text
from attnlab.utils.outputs import OutputFolder
from attnlab.utils.precision import native_bf16

logger = logging.getLogger(__name__)

SEA_GRID_KS = 3  # distill's default dynamic k: k/2, k, 2k


def read_plan(path: Path) -> dict[str, Any]:
    """A resumed demo's ``plan.json``; ``ValueError`` naming it when it is damaged."""
    return readers.read_json(path, "the demo's plan (a JSON object written by attnlab demo)",
                             "; remove it and the demo plans again")



class Demo:
    """One invocation of the demo in ``out``, timed by ``budget``."""

    def __init__(self, out: Path, scale: Scale, budget: Budget, device: str,
                 progress: bool, precision: str = "auto", train_jobs: int | None = None,
                 real_model: str = "off") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, "
                             f"got {precision!r}")
        if real_model not in REAL_MODEL_CHOICES:
            raise ValueError(f"real_model must be one of {', '.join(REAL_MODEL_CHOICES)}, "
                             f"got {real_model!r}")
        if train_jobs is not None and train_jobs < 1:
            raise ValueError(f"train_jobs must be at least 1, got {train_jobs}")
        self.out, self.scale, self.budget, self.progress = out, scale, budget, progress
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" \
            else device
        self.cuda = self.device.startswith("cuda")
        self.bf16 = precision == "bf16" or (precision == "auto" and native_bf16(self.device))
        self.precision = "bf16" if self.bf16 else "fp32"
        self.load_start = os.getloadavg()[0]
        self.cores = 1 if self.cuda else torch.get_num_threads()  # training lanes' share
        self.jobs, self.threads = self._jobs(train_jobs)
        self.jobs_forced = train_jobs is not None
        self.lanes = Lanes()  # one at a time until the probes say otherwise
        self.train_step_s: dict[str, float] = {}
        self.lanes_choice: dict[str, Any] = {}
        self.train_planned_s = 0.0
        self.real, self.real_note = self._real_model(real_model)

    def _real_model(self, choice: str) -> tuple[RealModel | None, str]:
        """The real-model stage if it runs, and a sentence for the report either way;
        ``ConfigError`` before any work when it was asked for (``on``) under a strict budget
        shorter than the stage alone takes on the reference machine."""
        real = self.scale.real_model
        need_s = real.reference_s + self.scale.report_reserve_s
        if choice == "on" and self.budget.strict and self.budget.budget_s < need_s:
            raise ConfigError(
                f"--strict-budget --budget-minutes {self.budget.budget_s / 60:g} cannot fit the "
                f"real-model stage that --real-model on asks for: it alone needs ~"
                f"{need_s / 60:.3g} minutes on the reference machine (2 CPU cores); give a "
                "larger --budget-minutes, or leave out --strict-budget or --real-model on")
        if choice == "off" or (choice == "auto" and
                               self.budget.budget_s < REAL_MODEL_MINUTES * 60 - 1e-6):
            return None, (f"The real-model stage ({real.name}) did not run: it needs "
                          f"--budget-minutes {REAL_MODEL_MINUTES:.0f} (or --real-model on).")
        if (why := real.missing()) is not None:
            if choice == "on":
                raise ConfigError(f"the real-model stage cannot run: {why}")
            return None, f"The real-model stage ({real.name}) did not run: {why}."
        return real, real.describe()

    def _jobs(self, jobs: int | None) -> tuple[int, int]:
        """How many models may train at once, and on how many threads each: by default
        (``jobs`` None) on a CPU as many as there are threads, one thread each, at most one per
        model (:meth:`choose_lanes` then decides from a probe); on a GPU one at a time."""
        if jobs is None:
            jobs = 1 if self.cuda else max(1, min(len(TRAINED), self.cores))
        return jobs, max(1, self.cores // jobs)

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
        step_s = {r.name: (r.ms_median + r.ms_min) / 2e3 for r in records}
        self.choose_lanes(step_s)
        return step_s

    def choose_lanes(self, step_s: dict[str, float]) -> None:
        """One model at a time on every thread, or :attr:`jobs` at once on :attr:`threads`
        each: a second probe times the trained models in that arrangement (one process per
        lane; its step times are kept in ``plan.json``'s ``lanes_choice``), and the models
        train together when it predicts their training sooner, or when ``train_jobs`` asked
        for it (a resumed demo keeps its plan's choice). Sets :attr:`lanes` and
        :attr:`train_step_s`, the step times to plan with."""
        self.train_step_s = {n: step_s[n] for n in TRAINED}
        if self.jobs == 1:
            return
        order = sorted(TRAINED, key=lambda name: -step_s[name])  # slowest first: even lanes
        planned = self.out / "plan.json"
        if planned.is_file():
            plan = read_plan(planned)
            self.lanes_choice = plan.get("lanes_choice") or {}
            chosen = plan.get("train_jobs", 1) > 1
        else:
            with tempfile.TemporaryDirectory(dir=self.out) as tmp:
                paths = [Path(tmp) / f"lane-{i}.json" for i in range(self.jobs)]
                probe_concurrently([{n: self.trained_config(n) for n in order[i::self.jobs]}
                                    for i in range(self.jobs)], self.scale.together_reps,
                                   self.threads, paths)
                together = {r.name: (r.ms_median + r.ms_min) / 2e3
                            for p in paths for r in read_json(p)[1]}
            alone_s = train_seconds(self.train_step_s, 100, self.scale, self.tokens_per_step)
            together_s = train_seconds({n: together[n] for n in order}, 100, self.scale,
                                       self.tokens_per_step, self.together_lanes)
            chosen = self.jobs_forced or together_s < alone_s
            self.lanes_choice = {"alone_s_per_100_steps": alone_s,
                                 "together_s_per_100_steps": together_s, "together": chosen,
                                 "together_step_s": together}
            logger.info("probe: 100 steps of every model take ~%.0f s one at a time, ~%.0f s "
                        "%d at a time: training %s", alone_s, together_s, self.jobs,
                        f"{self.jobs} at a time" if chosen else "one at a time")
        if chosen:
            self.lanes = self.together_lanes
            self.train_step_s = {n: self.lanes_choice["together_step_s"][n] for n in order}

    @property
    def together_lanes(self) -> Lanes:
        """:attr:`jobs` runs at once, as many at full speed as the threads allow."""
        return Lanes(self.jobs, max(1, self.cores // self.threads))

    def later_minimum_s(self, step_s: dict[str, float]) -> float:
        """Seconds the stages after training need at their minimums (at the probe's pace)."""
        return (distill_seconds(self.distill_cost(step_s), self.scale.min_distill_steps)
                + self.bench_min_s(step_s) + self.real_model_s(step_s)
                + self.scale.report_reserve_s)

    def real_model_s(self, step_s: dict[str, float]) -> float:
        """Seconds reserved for the real-model stage (0 when it does not run)."""
        return 0.0 if self.real is None else real_model_seconds(self.real, step_s[SPEED_PROBE])

    def bench_min_s(self, step_s: dict[str, float]) -> float:
        return bench_min_seconds(self.scale, step_s[SPEED_PROBE], self.cuda)

    def fit_train_steps(self, step_s: dict[str, float], train_step_s: dict[str, float],
                        pace: float = 1.0, done: dict[str, int] | None = None,
                        ) -> tuple[int, float, float]:
        """``(steps, training seconds, seconds every stage at its minimum needs)`` for the
        time left: the training minimum, plus ``train_share`` of what the budget leaves beyond
        every stage's minimum and the benchmark's share; under the minimum only with
        ``strict_budget``. ``train_step_s``: the models' seconds per step as they will train;
        ``pace``: the later stages' time over the probe's; ``done``: steps trained already."""
        s, left, lanes = self.scale, self.budget.remaining(), self.lanes
        tokens = self.tokens_per_step
        min_steps = s.min_train_steps(tokens)
        train_min_s = train_seconds(train_step_s, min_steps, s, tokens, lanes, done)
        needed = train_min_s + pace * self.later_minimum_s(step_s)
        spare = left - needed - s.bench_share * self.budget.budget_s
        seconds = train_min_s + s.train_share * max(0.0, spare)
        if needed > left and self.budget.strict:
            seconds = train_min_s * max(0.0, left) / needed  # every stage cut alike
        steps = plan_train_steps(train_step_s, seconds, s, tokens, lanes=lanes, done=done,
                                 floor=1 if self.budget.strict else min_steps)
        return steps, seconds, needed

    def _check_resumed_options(self, plan: dict[str, Any]) -> None:
        """``RunDirError`` when this invocation asks for a budget mode or a number of models
        trained at once other than the ones the demo in ``out`` was planned with: the report
        would record one and the demo run the other."""
        strict = plan.get("strict_budget", False)
        if strict != self.budget.strict:
            raise RunDirError(f"{self.out} holds a demo planned {'with' if strict else 'without'}"
                              f" --strict-budget; finish it {'with' if strict else 'without'} "
                              "it, or give another --out")
        if self.jobs_forced and plan.get("train_jobs", 1) != self.jobs:
            raise RunDirError(f"{self.out} holds a demo that trains {plan.get('train_jobs', 1)} "
                              f"model(s) at a time; finish it with --train-jobs "
                              f"{plan.get('train_jobs', 1)} (or without the option), or give "
                              "another --out")

    def plan(self, step_s: dict[str, float]) -> dict[str, Any]:
        """The training steps from the probe (kept in ``plan.json``; re-planned once from the
        measured pace, :meth:`replan_training`)."""
        path = self.out / "plan.json"
        if path.is_file():
            plan = read_plan(path)
            if plan["scale"] != self.scale.name:
                raise RunDirError(f"{self.out} holds a {plan['scale']} demo; finish it with "
                                  f"that mode or give another --out")
            if plan.get("precision", "fp32") != self.precision:
                raise RunDirError(f"{self.out} holds a demo trained in {plan.get('precision')};"
                                  f" finish it with --precision {plan.get('precision')} or "
                                  "give another --out")
            self._check_resumed_options(plan)
            return plan
        steps, seconds, needed = self.fit_train_steps(step_s, self.train_step_s)
        tokens = self.tokens_per_step
        warmup = self.trained_config(BASELINE).train.warmup_steps
        plan = {"scale": self.scale.name, "budget_s": self.budget.budget_s,
                "train_steps": steps, "train_tokens": steps * tokens,
                "warmup_steps": min(warmup, max(1, steps // 10)),
                "strict_budget": self.budget.strict, "precision": self.precision,
                "train_jobs": self.lanes.jobs,
                "train_threads": self.threads if self.lanes.jobs > 1 else None,
                "lanes_choice": self.lanes_choice}
        logger.info("plan: %d training steps (%d tokens) per model, %d at a time, in ~%.0f s; "
                    "every stage at its minimum needs ~%.0f s of the %.0f s left", steps,
                    steps * tokens, self.lanes.jobs, seconds, needed, self.budget.remaining())
        atomic_write_json(path, plan)
        self.check_the_rest(plan, needed, "the stages at their minimums")
        return plan

    def replan_training(self, plan: dict[str, Any], step_s: dict[str, float]) -> None:
        """Train the first model of every lane through its warm-up (its learning rate does
        not depend on the run's length until then), then re-plan every model's steps from
        the pace they measured, once (``plan.json``: ``replanned``). A probe of a few seconds
        on a shared machine can be off by a third; the warm-up gives ~20 s of every lane."""
        warmup, first = plan["warmup_steps"], list(self.train_step_s)[:self.lanes.jobs]
        if "replanned" in plan or warmup >= plan["train_steps"]:
            return
        runs = [run for name in first
                if (run := self.train_run(name, plan, pause_at=warmup)) is not None]
        self.train_runs(runs)
        measured = {r.name: measured_step_s(r.out_dir, r.cfg) for r in runs}
        ratios = [m / self.train_step_s[n] for n, m in measured.items() if m is not None]
        if not ratios:  # finished earlier: nothing measured
            plan["replanned"] = {}
            return
        pace = sorted(ratios)[len(ratios) // 2]
        steps, seconds, needed = self.fit_train_steps(
            step_s, {n: pace * t for n, t in self.train_step_s.items()}, pace,
            {name: warmup for name in first})
        tokens = self.tokens_per_step
        plan["replanned"] = {"at_step": warmup, "pace": pace, "probe_steps": plan["train_steps"],
                             "measured_step_s": measured}
        plan.update(train_steps=steps, train_tokens=steps * tokens)
        logger.info("plan: after %d steps of %s at x%.2f the probe's pace, %d training steps "
                    "per model (the probe planned %d) in ~%.0f s", warmup, ", ".join(first),
                    pace, steps, plan["replanned"]["probe_steps"], seconds)
        atomic_write_json(self.out / "plan.json", plan)
        self.check_the_rest(plan, needed, "training and the later stages at their minimums")

    def check_training(self, plan: dict[str, Any], step_s: dict[str, float],
                       started: float) -> None:
        """After a model's training: the rest of the training (planned to end
        ``train_planned_s`` after ``started``) and the later stages at their minimums, at the
        measured pace."""
        pace = self.budget.pace()
        rest_s = (max(0.0, pace * self.train_planned_s - (self.budget.elapsed() - started))
                  + pace * self.later_minimum_s(step_s))
        rest = [n for n in TRAINED if n not in self.budget.runs_s]
        self.check_the_rest(plan, rest_s, f"training {', '.join(rest)} and the later stages"
                            if rest else "the distillation and the benchmark")

    def distill_cost(self, step_s: dict[str, float], pace: float = 1.0,
                     names: tuple[str, ...] = tuple(STUDENTS)) -> DistillCost:
        """What distilling ``names`` costs, at ``pace`` times the probed step times."""
        d = self.distill_config("sea", 1).distill
        seq_len = d.seq_len or self.config(TRAINED[TEACHER]).train.seq_len
        tokens = d.batch_size * seq_len
        grid = {"sea": SEA_GRID_KS * len(d.query_skip)}
        return DistillCost({n: pace * step_s[n] for n in names}, pace * step_s[TEACHER],
                           tokens, d.eval_tokens, d.final_eval_tokens or d.eval_tokens, grid,
                           evals=self.scale.distill_evals, grid_reps=d.grid_reps,
                           seq_len=seq_len)

    def plan_distill(self, plan: dict[str, Any], step_s: dict[str, float]) -> int:
        """The distillation steps, planned once training is done at the pace it measured
        (added to ``plan.json``): what the time left after the benchmark's share allows,
        never below the minimum unless ``strict_budget``."""
        pace, s = self.budget.pace(), self.scale
        if "distill_steps" not in plan:
            bench_s = max(pace * self.bench_min_s(step_s), s.bench_share * self.budget.budget_s)
            seconds = max(0.0, self.budget.remaining() - bench_s - s.report_reserve_s
                          - pace * self.real_model_s(step_s))
            steps = plan_distill_steps(self.distill_cost(step_s, pace), seconds, s,
                                       floor=1 if self.budget.strict else s.min_distill_steps)
            plan["distill_steps"] = steps
            logger.info("plan: %d distillation steps per student in ~%.0f s (pace x%.2f the "
                        "probe's)", steps, seconds, pace)
            atomic_write_json(self.out / "plan.json", plan)
            rest = (distill_seconds(self.distill_cost(step_s, pace), steps)
                    + pace * (self.bench_min_s(step_s) + self.real_model_s(step_s))
                    + s.report_reserve_s)
            self.check_the_rest(plan, rest, "the distillation and the later stages")
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

    def train_run(self, name: str, plan: dict[str, Any], pause_at: int | None = None,
                  ) -> Run | None:
        """The training of model ``name`` to the plan's steps (resuming a started run, whose
        ``config.yaml`` takes the re-planned length), or None if it finished earlier."""
        run_dir = self.out / "runs" / name
        if self._finished(name, run_dir):
            return None
        steps, s = plan["train_steps"], self.scale
        every = max(1, steps // s.evals)
        length = (f"train.steps={steps}", f"train.eval_every={every}",
                  f"train.ckpt_every={every}", f"train.log_every={max(1, min(10, every // 2))}")
        if not (run_dir / "config.yaml").is_file():
            cfg = self.trained_config(name, (
                *length, f"train.warmup_steps={plan['warmup_steps']}",
                f"train.eval_tokens={s.eval_tokens}",
                f"train.final_eval_tokens={s.final_eval_tokens}"))
            return Run(name, cfg, run_dir, resume=False, pause_at=pause_at)
        cfg = load_run_config(run_dir / "config.yaml", length)
        atomic_write_text(run_dir / "config.yaml", dump_yaml(cfg))  # the length that runs
        return Run(name, cfg, run_dir, resume=True, pause_at=pause_at)

    def train_runs(self, runs: list[Run], done: Callable[[Run, float], None] | None = None,
                   ) -> None:
        """Train ``runs`` on :attr:`lanes`: in processes of their own when several at once,
        else here, one after the other; ``done(run, seconds)`` after each."""
        if self.lanes.jobs > 1:
            train_runs(runs, self.lanes.jobs, self.threads, progress=self.progress,
                       on_done=done)
            return
        for run in runs:
            start = self.budget.clock()
            train(run.cfg, run.out_dir, resume=run.resume, progress=self.progress,
                  pause_at=run.pause_at)
            if done is not None:
                done(run, self.budget.clock() - start)

    def train_models(self, plan: dict[str, Any], step_s: dict[str, float]) -> None:
        """Train every model of :data:`TRAINED` on :attr:`lanes` (reusing finished runs,
        resuming started ones), its steps re-planned after the first warm-ups; after each
        run, re-plan the rest at the measured pace."""
        self.replan_training(plan, step_s)
        started = self.budget.elapsed()
        runs = [run for name in self.train_step_s
                if (run := self.train_run(name, plan)) is not None]
        tokens = self.tokens_per_step
        paused = {name: plan["replanned"]["at_step"]
                  for name in plan.get("replanned", {}).get("measured_step_s", {})}
        spans = train_spans({r.name: self.train_step_s[r.name] for r in runs},
                            plan["train_steps"], self.scale, tokens, self.lanes, paused)
        self.train_planned_s = max((end for _, end in spans.values()), default=0.0)
        for run in runs:
            if not run.resume or run.name in paused:  # else a part of a run from before
                self.budget.planned_s[run.name] = spans[run.name][1] - spans[run.name][0]

        def done(run: Run, seconds: float) -> None:
            self.budget.record_run(run.name, seconds)
            self.check_training(plan, step_s, started)

        self.train_runs(runs, done)

    def distill_config(self, name: str, steps: int) -> DistillRunConfig:
        """Distillation of student ``name`` from the teacher run, ``steps`` steps."""
        core = self.config(STUDENTS[name]).model.attention.core
        base = {"distill": {
            "teacher": str(self.out / "runs" / TEACHER), "student_attention": core.to_yaml(),
            "steps": steps, "ckpt_every": max(1, steps // 4),
            "eval_every": max(1, steps // self.scale.distill_evals) if self.scale.distill_evals
            else 0,
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

    def bench(self, step_s: dict[str, float]) -> None:
        """Attention layers against length: up to the minimum length whatever the time (unless
        ``strict_budget``), longer within the benchmark's share of the budget."""
        path = self.out / "bench-attention-layers.json"
        if path.is_file():
            logger.info("benchmark: finished earlier, reusing %s", path)
            return
        models = {name: load_run_config(builtin_config(src), overrides).model
                  for name, (src, overrides) in LAYERS.items()}
        seconds = min(self.scale.bench_share * self.budget.budget_s,
                      self.budget.remaining() - self.scale.report_reserve_s
                      - self.budget.pace() * self.real_model_s(step_s))
        cuda, s = self.cuda, self.scale
        run_layers(models, s.gpu_seq_lens if cuda else s.seq_lens, reps=s.reps,
                   max_mem_gb=None if cuda else s.cpu_max_mem_gb,
                   time_budget_s=max(seconds, 1.0),
                   min_seq_len=0 if self.budget.strict else s.bench_min_len(cuda),
                   json_path=path, device=self.device)

    def real_model_stage(self, plan: dict[str, Any], step_s: dict[str, float]) -> None:
        """The real-model stage (:mod:`attnlab.demo.real_model`) at its fixed sizes; with
        ``strict_budget``, skipped (and said) when the time left cannot cover it."""
        assert self.real is not None
        need_s = self.budget.pace() * self.real_model_s(step_s) + self.scale.report_reserve_s
        if self.budget.strict and need_s > self.budget.remaining():
            decision = (f"skipping the real-model stage ({self.real.name}): it needs ~"
                        f"{need_s:.0f} s at the pace measured so far, "
                        f"{max(0.0, self.budget.remaining()):.0f} s are left (--strict-budget)")
            logger.warning("demo: %s", decision)
            plan.setdefault("decisions", []).append(decision)
            atomic_write_json(self.out / "plan.json", plan)
            self.real, self.real_note = None, f"The real-model stage was skipped: {decision}."
            return
        self.budget.planned_s["real-model"] = self.real_model_s(step_s)
        self.check_the_rest(plan, need_s, "the real-model stage")
        self.real.run(self.out, self.device, self.progress)

    @functools.cached_property
    def tokens_per_step(self) -> int:
        """Training tokens per step of every trained model."""
        t = self.config(TRAINED[BASELINE]).train
        return t.batch_size * t.seq_len * t.grad_accum


def run_demo(out: str | Path, *, budget_minutes: float = BUDGET_MINUTES,
             scale: str = "full", device: str = "auto", progress: bool = True,
             strict_budget: bool = False, precision: str = "auto",
             train_jobs: int | None = None, real_model: str = "auto",
             clock: Callable[[], float] = time.perf_counter, force: bool = False
             ) -> dict[str, Any]:
    """Run (or finish) the demo in ``out``; returns the report's results dict. ``scale``:
    ``full`` or ``smoke`` (:data:`attnlab.demo.plan.SCALES`); ``strict_budget``: keep the
    budget and mark the stages it cuts below their minimum inconclusive (default: keep the
    minimums and go over the budget, saying by how much); ``precision``: how the models train
    (:data:`~attnlab.demo.plan.PRECISIONS`); ``train_jobs``: how many models train at once
    (default: as many as the CPU has threads, one thread each; one on a GPU); ``real_model``:
    the real-model stage (:mod:`attnlab.demo.real_model`), ``auto`` = from
    :data:`~attnlab.demo.plan.REAL_MODEL_MINUTES` of budget; ``clock``: seconds for the
    budget (tests inject a slow one); ``force``: write into a folder that holds files the demo
    did not write (the write policy, :mod:`attnlab.utils.outputs`; re-running into the
    demo's own folder resumes it)."""
    destination = OutputFolder.of(out, "demo", force=force)
    destination.check()
    out = Path(out)
    budget = Budget(budget_minutes * 60.0, strict_budget, clock)
    demo = Demo(out, SCALES[scale], budget, device, progress, precision, train_jobs,
                real_model)
    destination.claim()
    names = ["probe", "training", *STUDENTS, "bench",
             *(["real-model"] if demo.real else []), "report"]
    with logging_redirect_tqdm(), tqdm(total=len(names), desc="demo", unit="stage",
                                       disable=not progress, dynamic_ncols=True) as bar:

        def stage(name: str, fn: Callable[[], Any]) -> Any:
            bar.set_postfix_str(name)
            result = budget.timed(name, fn)
            bar.update(1)
            return result

        step_s = stage("probe", demo.probe)
        plan = demo.plan(step_s)
        stage("training", lambda: demo.train_models(plan, step_s))
        distill_steps = demo.plan_distill(plan, step_s)
        for name in STUDENTS:
            stage(name, lambda n=name: demo.distill_student(n, distill_steps))
        stage("bench", lambda: demo.bench(step_s))
        if demo.real is not None:
            stage("real-model", lambda: demo.real_model_stage(plan, step_s))
        return stage("report", lambda: write_report(demo, plan))
