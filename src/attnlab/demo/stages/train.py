"""Stage 2, training: ``plan.json`` (the steps the budget allows, re-planned once after the
first warm-ups), then ``runs/<model>/``, each model of :data:`~attnlab.demo.plan.TRAINED`
trained on the same tokens (``attnlab train`` run folders); on a CPU several at once, each in
its own process on its share of the threads, its log in ``runs/<model>.log``
(:mod:`attnlab.demo.parallel`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from attnlab.config import dump_yaml
from attnlab.demo.parallel import Run, measured_step_s, train_runs
from attnlab.demo.plan import BASELINE, TRAINED, plan_train_steps, train_seconds, train_spans
from attnlab.demo.stages.base import Stage
from attnlab.train import RunDirError, load_run_config, train
from attnlab.utils.io import atomic_write_text

logger = logging.getLogger(__name__)


class TrainStage(Stage):
    """Every model of :data:`~attnlab.demo.plan.TRAINED` on the probe's lanes
    (:class:`~attnlab.demo.stages.probe.ProbeStage`), to the steps :meth:`plan` fits in the
    budget."""

    name = "training"

    def plan(self) -> None:
        """The training steps from the probe (kept in ``plan.json``; re-planned once from the
        measured pace, :meth:`replan`); a resumed demo's plan, when this invocation asks for
        the same."""
        demo, probe = self.demo, self.demo.probe
        if demo.plan_path.is_file():
            demo.plan = demo.read_plan()
            self.check_resumed()
            return
        steps, seconds, needed = self.fit_steps(probe.train_step_s)
        tokens, lanes = demo.tokens_per_step, probe.lanes
        warmup = demo.trained_config(BASELINE).train.warmup_steps
        demo.plan = {"scale": demo.scale.name, "budget_s": demo.budget.budget_s,
                     "train_steps": steps, "train_tokens": steps * tokens,
                     "warmup_steps": min(warmup, max(1, steps // 10)),
                     "strict_budget": demo.budget.strict, "precision": demo.precision,
                     "train_jobs": lanes.jobs,
                     "train_threads": probe.threads if lanes.jobs > 1 else None,
                     "lanes_choice": probe.choice}
        logger.info("plan: %d training steps (%d tokens) per model, %d at a time, in ~%.0f s; "
                    "every stage at its minimum needs ~%.0f s of the %.0f s left", steps,
                    steps * tokens, lanes.jobs, seconds, needed, demo.budget.remaining())
        demo.save_plan()
        demo.check_the_rest(needed, "the stages at their minimums")

    def check_resumed(self) -> None:
        """``RunDirError`` when this invocation asks for a mode, precision, budget mode or
        number of models trained at once other than the ones the demo in ``out`` was planned
        with: the report would record one and the demo run the other."""
        demo, plan = self.demo, self.demo.plan
        again = "or give another --out"
        if plan["scale"] != demo.scale.name:
            raise RunDirError(f"{demo.out} holds a {plan['scale']} demo; finish it with "
                              f"that mode {again}")
        if plan.get("precision", "fp32") != demo.precision:
            raise RunDirError(f"{demo.out} holds a demo trained in {plan.get('precision')};"
                              f" finish it with --precision {plan.get('precision')} {again}")
        strict = plan.get("strict_budget", False)
        if strict != demo.budget.strict:
            with_it = "with" if strict else "without"
            raise RunDirError(f"{demo.out} holds a demo planned {with_it} --strict-budget; "
                              f"finish it {with_it} it, {again}")
        jobs = plan.get("train_jobs", 1)
        if demo.probe.forced and jobs != demo.probe.jobs:
            raise RunDirError(f"{demo.out} holds a demo that trains {jobs} model(s) at a "
                              f"time; finish it with --train-jobs {jobs} (or without the "
                              f"option), {again}")

    def fit_steps(self, train_step_s: dict[str, float], pace: float = 1.0,
                  done: dict[str, int] | None = None) -> tuple[int, float, float]:
        """``(steps, training seconds, seconds every stage at its minimum needs)`` for the
        time left: the training minimum, plus ``train_share`` of what the budget leaves beyond
        every stage's minimum and the benchmark's share; under the minimum only with
        ``strict_budget``. ``train_step_s``: the models' seconds per step as they will train;
        ``pace``: the later stages' time over the probe's; ``done``: steps trained already."""
        demo, s, lanes = self.demo, self.demo.scale, self.demo.probe.lanes
        budget = demo.budget
        left, tokens = budget.remaining(), demo.tokens_per_step
        min_steps = s.min_train_steps(tokens)
        train_min_s = train_seconds(train_step_s, min_steps, s, tokens, lanes, done)
        needed = train_min_s + pace * self.later_minimum_s()
        spare = left - needed - s.bench_share * budget.budget_s
        seconds = train_min_s + s.train_share * max(0.0, spare)
        if needed > left and budget.strict:
            seconds = train_min_s * max(0.0, left) / needed  # every stage cut alike
        steps = plan_train_steps(train_step_s, seconds, s, tokens, lanes=lanes, done=done,
                                 floor=1 if budget.strict else min_steps)
        return steps, seconds, needed

    def run(self, part: str) -> None:
        """Train every model (reusing finished runs, resuming started ones), its steps
        re-planned after the first warm-ups (:meth:`replan`); after each run, re-plan the rest
        at the measured pace (:meth:`check`)."""
        demo, plan, step_s = self.demo, self.demo.plan, self.demo.probe.train_step_s
        self.replan()
        started = demo.budget.elapsed()
        runs = [run for name in step_s if (run := self.train_run(name)) is not None]
        paused = {name: plan["replanned"]["at_step"]
                  for name in plan.get("replanned", {}).get("measured_step_s", {})}
        spans = train_spans({r.name: step_s[r.name] for r in runs}, plan["train_steps"],
                            demo.scale, demo.tokens_per_step, demo.probe.lanes, paused)
        planned_s = max((end for _, end in spans.values()), default=0.0)
        for run in runs:
            if not run.resume or run.name in paused:  # else a part of a run from before
                demo.budget.planned_s[run.name] = spans[run.name][1] - spans[run.name][0]

        def done(run: Run, seconds: float) -> None:
            """Record the run's seconds, then re-plan the rest."""
            demo.budget.record_run(run.name, seconds)
            self.check(started, planned_s)

        self.train_on_lanes(runs, done)

    def replan(self) -> None:
        """Train the first model of every lane through its warm-up (its learning rate does
        not depend on the run's length until then), then re-plan every model's steps from
        the pace they measured, once (``plan.json``: ``replanned``). A probe of a few seconds
        on a shared machine can be off by a third; the warm-up gives ~20 s of every lane."""
        demo, plan, step_s = self.demo, self.demo.plan, self.demo.probe.train_step_s
        warmup, first = plan["warmup_steps"], list(step_s)[:demo.probe.lanes.jobs]
        if "replanned" in plan or warmup >= plan["train_steps"]:
            return
        runs = [run for name in first
                if (run := self.train_run(name, pause_at=warmup)) is not None]
        self.train_on_lanes(runs)
        measured = {r.name: measured_step_s(r.out_dir, r.cfg) for r in runs}
        ratios = [m / step_s[n] for n, m in measured.items() if m is not None]
        if not ratios:  # finished earlier: nothing measured
            plan["replanned"] = {}
            return
        pace = sorted(ratios)[len(ratios) // 2]
        steps, seconds, needed = self.fit_steps(
            {n: pace * t for n, t in step_s.items()}, pace, {name: warmup for name in first})
        plan["replanned"] = {"at_step": warmup, "pace": pace, "probe_steps": plan["train_steps"],
                             "measured_step_s": measured}
        plan.update(train_steps=steps, train_tokens=steps * demo.tokens_per_step)
        logger.info("plan: after %d steps of %s at x%.2f the probe's pace, %d training steps "
                    "per model (the probe planned %d) in ~%.0f s", warmup, ", ".join(first),
                    pace, steps, plan["replanned"]["probe_steps"], seconds)
        demo.save_plan()
        demo.check_the_rest(needed, "training and the later stages at their minimums")

    def check(self, started: float, planned_s: float) -> None:
        """After a model's training: the rest of the training (planned to end ``planned_s``
        after ``started``) and the later stages at their minimums, at the measured pace."""
        budget = self.demo.budget
        pace = budget.pace()
        rest_s = (max(0.0, pace * planned_s - (budget.elapsed() - started))
                  + pace * self.later_minimum_s())
        rest = [n for n in TRAINED if n not in budget.runs_s]
        self.demo.check_the_rest(rest_s, f"training {', '.join(rest)} and the later stages"
                                 if rest else "the distillation and the benchmark")

    def train_run(self, name: str, pause_at: int | None = None) -> Run | None:
        """The training of model ``name`` to the plan's steps (resuming a started run, whose
        ``config.yaml`` takes the re-planned length), or None if it finished earlier."""
        demo, plan, s = self.demo, self.demo.plan, self.demo.scale
        run_dir = demo.out / "runs" / name
        if self.reused_run(name, run_dir):
            return None
        steps = plan["train_steps"]
        every = max(1, steps // s.evals)
        length = (f"train.steps={steps}", f"train.eval_every={every}",
                  f"train.ckpt_every={every}", f"train.log_every={max(1, min(10, every // 2))}")
        if not (run_dir / "config.yaml").is_file():
            cfg = demo.trained_config(name, (
                *length, f"train.warmup_steps={plan['warmup_steps']}",
                f"train.eval_tokens={s.eval_tokens}",
                f"train.final_eval_tokens={s.final_eval_tokens}"))
            return Run(name, cfg, run_dir, resume=False, pause_at=pause_at)
        cfg = load_run_config(run_dir / "config.yaml", length)
        atomic_write_text(run_dir / "config.yaml", dump_yaml(cfg))  # the length that runs
        return Run(name, cfg, run_dir, resume=True, pause_at=pause_at)

    def train_on_lanes(self, runs: list[Run], done: Callable[[Run, float], None] | None = None,
              ) -> None:
        """Train ``runs`` on the probe's lanes: in processes of their own when several at
        once, else here, one after the other; ``done(run, seconds)`` after each."""
        demo, lanes = self.demo, self.demo.probe.lanes
        if lanes.jobs > 1:
            train_runs(runs, lanes.jobs, demo.probe.threads, progress=demo.progress,
                       on_done=done)
            return
        for run in runs:
            start = demo.budget.clock()
            train(run.cfg, run.out_dir, resume=run.resume, progress=demo.progress,
                  pause_at=run.pause_at)
            if done is not None:
                done(run, demo.budget.clock() - start)
