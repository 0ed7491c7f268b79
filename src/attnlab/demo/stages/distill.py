"""Stage 3, distillation: ``runs/<student>/``, SEA and Performer distilled from the RoPE
teacher (``attnlab distill`` run folders), their steps planned once training is done."""

from __future__ import annotations

import logging

from attnlab.demo.plan import (
    STUDENTS,
    TEACHER,
    TRAINED,
    DistillCost,
    distill_seconds,
    plan_distill_steps,
)
from attnlab.demo.stages.base import Stage
from attnlab.distill import DistillRunConfig, distill, load_distill_config

logger = logging.getLogger(__name__)

SEA_GRID_KS = 3  # distill's default dynamic k: k/2, k, 2k


class DistillStage(Stage):
    """Every student of :data:`~attnlab.demo.plan.STUDENTS`, one part each, the same steps."""

    name = "distillation"

    @property
    def parts(self) -> tuple[str, ...]:
        """One part per student, each timed as a stage of its name."""
        return tuple(STUDENTS)

    def minimum_s(self) -> float:
        """Every student distilled its minimum steps, at the probe's pace."""
        return distill_seconds(self.cost(), self.demo.scale.min_distill_steps)

    def cost(self, pace: float = 1.0, names: tuple[str, ...] = tuple(STUDENTS)) -> DistillCost:
        """What distilling ``names`` costs, at ``pace`` times the probed step times."""
        demo, step_s = self.demo, self.demo.probe.step_s
        d = self.config("sea", 1).distill
        seq_len = d.seq_len or demo.config(TRAINED[TEACHER]).train.seq_len
        tokens = d.batch_size * seq_len
        grid = {"sea": SEA_GRID_KS * len(d.query_skip)}
        return DistillCost({n: pace * step_s[n] for n in names}, pace * step_s[TEACHER],
                           tokens, d.eval_tokens, d.final_eval_tokens or d.eval_tokens, grid,
                           evals=demo.scale.distill_evals, grid_reps=d.grid_reps,
                           seq_len=seq_len)

    def plan(self) -> None:
        """The distillation steps, planned once training is done at the pace it measured
        (added to ``plan.json``): what the time left after the benchmark's share allows,
        never below the minimum unless ``strict_budget``."""
        demo, plan, s, budget = self.demo, self.demo.plan, self.demo.scale, self.demo.budget
        pace = budget.pace()
        if "distill_steps" not in plan:
            bench_min, real_min = demo.bench.minimum_s(), demo.real_model.minimum_s()
            report_min = demo.report.minimum_s()
            bench_s = max(pace * bench_min, s.bench_share * budget.budget_s)
            seconds = max(0.0, budget.remaining() - bench_s - report_min - pace * real_min)
            steps = plan_distill_steps(self.cost(pace), seconds, s,
                                       floor=1 if budget.strict else s.min_distill_steps)
            plan["distill_steps"] = steps
            logger.info("plan: %d distillation steps per student in ~%.0f s (pace x%.2f the "
                        "probe's)", steps, seconds, pace)
            demo.save_plan()
            rest = (distill_seconds(self.cost(pace), steps) + pace * (bench_min + real_min)
                    + report_min)
            demo.check_the_rest(rest, "the distillation and the later stages")
        for name in STUDENTS:
            budget.planned_s[name] = distill_seconds(self.cost(names=(name,)),
                                                     plan["distill_steps"])

    def run(self, part: str) -> None:
        """Distil student ``part`` (resume a started run, reuse a finished one)."""
        demo, run_dir = self.demo, self.demo.out / "runs" / part
        if self.reused_run(part, run_dir):
            return
        resume = (run_dir / "distill.yaml").is_file()
        if resume:
            demo.budget.planned_s.pop(part, None)  # a part of the run says nothing of the pace
        cfg = (load_distill_config(run_dir / "distill.yaml") if resume
               else self.config(part, demo.plan["distill_steps"]))
        distill(cfg, run_dir, resume=resume, progress=demo.progress)

    def config(self, name: str, steps: int) -> DistillRunConfig:
        """Distillation of student ``name`` from the teacher run, ``steps`` steps."""
        demo, s = self.demo, self.demo.scale
        core = demo.config(STUDENTS[name]).model.attention.core
        base = {"distill": {
            "teacher": str(demo.out / "runs" / TEACHER), "student_attention": core.to_yaml(),
            "steps": steps, "ckpt_every": max(1, steps // 4),
            "eval_every": max(1, steps // s.distill_evals) if s.distill_evals else 0,
            "log_every": max(1, min(10, steps // 4)), "device": demo.device}}
        return load_distill_config(base=base, overrides=s.distill)
