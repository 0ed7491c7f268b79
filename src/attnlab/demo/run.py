"""``attnlab demo``: every stage of the main job, resumable, within a time budget.

Stages, each leaving its result in ``out`` (atomically, so an interrupted demo re-run picks
up finished stages and resumes a half-done run from its last checkpoint):

1. ``probe.json``: one training step of every model, side by side (bench JSON);
2. ``plan.json``: the steps the budget allows (training; distillation once it starts);
3. ``runs/<model>/``: each model of :data:`~attnlab.demo.plan.TRAINED` trained on the same
   tokens (``attnlab train`` run folders);
4. ``runs/<student>/``: SEA and Performer distilled from the RoPE teacher
   (``attnlab distill`` run folders);
5. ``bench-attention-layers.json``: attention layers against sequence length (bench JSON);
6. ``demo.json`` (budget, stage times, notes), then ``report.md``, the PNGs and
   ``results.json`` (:func:`attnlab.report.build_report`).
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
from attnlab.demo.plan import (
    BASELINE,
    BUDGET_MINUTES,
    LAYERS,
    SCALES,
    STUDENTS,
    TEACHER,
    TRAINED,
    Scale,
    plan_distill_steps,
    plan_train_steps,
)
from attnlab.distill import DistillRunConfig, distill, load_distill_config
from attnlab.report import build_report, collect
from attnlab.train import RunDirError, load_run_config, train
from attnlab.train.config import RunConfig
from attnlab.utils.io import atomic_write_json

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


class Demo:
    """One invocation of the demo in ``out`` with ``budget_s`` seconds."""

    def __init__(self, out: Path, scale: Scale, budget_s: float, device: str,
                 progress: bool) -> None:
        self.out, self.scale, self.budget_s, self.progress = out, scale, budget_s, progress
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" \
            else device
        self.start = time.perf_counter()
        self.load_start = os.getloadavg()[0]
        self.stages_s: dict[str, float] = {}

    def remaining(self) -> float:
        """Seconds of the budget left in this invocation."""
        return self.budget_s - (time.perf_counter() - self.start)

    def config(self, source: str, overrides: tuple[str, ...] = ()) -> RunConfig:
        """A built-in config with the scale's and the given overrides, on the demo's device."""
        return load_run_config(builtin_config(source), [
            *self.scale.overrides, *overrides, f"train.device={self.device}"])

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its wall-clock seconds recorded as stage ``name``."""
        start = time.perf_counter()
        result = fn()
        self.stages_s[name] = time.perf_counter() - start
        logger.info("stage %s: %.1f s; %.0f s of the budget left", name, self.stages_s[name],
                    self.remaining())
        return result

    # ------------------------------------------------------------ stages

    def probe(self) -> dict[str, float]:
        """Seconds per training step of every model and student architecture, side by side."""
        path = self.out / "probe.json"
        if not path.is_file():
            cfgs = {name: self.config(src) for name, src in {**TRAINED, **STUDENTS}.items()}
            train_step.run_configs(cfgs, steps=self.scale.reps, json_path=path,
                                   device=self.device)
        else:
            logger.info("probe: finished earlier, reusing %s", path)
        _, records = read_json(path)
        return {r.name: r.ms_median / 1e3 for r in records}

    def plan(self, step_s: dict[str, float]) -> dict[str, Any]:
        """The training steps (planned once, kept in ``plan.json``)."""
        path = self.out / "plan.json"
        if path.is_file():
            plan = json.loads(path.read_text())
            if plan["scale"] != self.scale.name:
                raise RunDirError(f"{self.out} holds a {plan['scale']} demo; finish it with "
                                  f"that mode or give another --out")
            return plan
        tokens = self._tokens_per_step(self.config(TRAINED[BASELINE]))
        reserve = self.scale.bench_share * self.budget_s + self.scale.report_reserve_s
        seconds = self.scale.train_share * max(0.0, self.remaining() - reserve)
        steps = plan_train_steps({n: step_s[n] for n in TRAINED}, seconds, self.scale, tokens)
        plan = {"scale": self.scale.name, "budget_s": self.budget_s, "train_steps": steps,
                "train_tokens": steps * tokens}
        logger.info("plan: %d training steps (%d tokens) per model in ~%.0f s", steps,
                    steps * tokens, seconds)
        atomic_write_json(path, plan)
        return plan

    def plan_distill(self, plan: dict[str, Any], step_s: dict[str, float]) -> int:
        """The distillation steps (planned once training is done, added to ``plan.json``)."""
        if "distill_steps" in plan:
            return plan["distill_steps"]
        d = self.distill_config("sea", 1).distill
        tokens = d.batch_size * (d.seq_len or self.config(TRAINED[TEACHER]).train.seq_len)
        seconds = max(0.0, self.remaining() - self.scale.bench_share * self.budget_s
                      - self.scale.report_reserve_s)
        grid = {"sea": SEA_GRID_KS * len(d.query_skip)}
        steps = plan_distill_steps({n: step_s[n] for n in STUDENTS}, step_s[TEACHER], seconds,
                                   self.scale, tokens, d.eval_tokens,
                                   d.final_eval_tokens or d.eval_tokens, grid)
        plan["distill_steps"] = steps
        logger.info("plan: %d distillation steps per student in ~%.0f s", steps, seconds)
        atomic_write_json(self.out / "plan.json", plan)
        return steps

    def train_model(self, name: str, steps: int) -> None:
        """Train model ``name`` for ``steps`` (resume a started run, reuse a finished one)."""
        run_dir = self.out / "runs" / name
        if (run_dir / "summary.json").is_file():
            logger.info("%s: finished earlier, reusing %s", name, run_dir)
            return
        resume = (run_dir / "config.yaml").is_file()
        if resume:
            cfg = load_run_config(run_dir / "config.yaml")
        else:
            s = self.scale
            every = max(1, steps // s.evals)
            warmup = min(self.config(TRAINED[name]).train.warmup_steps, max(1, steps // 10))
            cfg = self.config(TRAINED[name], (
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
        if (run_dir / "summary.json").is_file():
            logger.info("%s: finished earlier, reusing %s", name, run_dir)
            return
        resume = (run_dir / "distill.yaml").is_file()
        cfg = (load_distill_config(run_dir / "distill.yaml") if resume
               else self.distill_config(name, steps))
        distill(cfg, run_dir, resume=resume, progress=self.progress)

    def bench(self) -> None:
        """Attention layers against length, within the benchmark's share of the budget."""
        path = self.out / "bench-attention-layers.json"
        if path.is_file():
            logger.info("benchmark: finished earlier, reusing %s", path)
            return
        models = {name: load_run_config(builtin_config(src), overrides).model
                  for name, (src, overrides) in LAYERS.items()}
        seconds = min(self.scale.bench_share * self.budget_s,
                      self.remaining() - self.scale.report_reserve_s)
        cuda = self.device.startswith("cuda")
        run_layers(models, self.scale.gpu_seq_lens if cuda else self.scale.seq_lens,
                   reps=self.scale.reps, max_mem_gb=None if cuda else self.scale.cpu_max_mem_gb,
                   time_budget_s=max(seconds, 1.0), json_path=path, device=self.device)

    def report(self) -> dict[str, Any]:
        """``demo.json``, then the report of every stage's results."""
        demo = {"mode": self.scale.name, "budget_s": self.budget_s,
                "wall_s": time.perf_counter() - self.start, "stages_s": self.stages_s,
                "device": self.device, "cpus": os.cpu_count(),
                "load_avg": [self.load_start, os.getloadavg()[0]], "notes": NOTES}
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
             scale: str = "full", device: str = "auto", progress: bool = True) -> dict[str, Any]:
    """Run (or finish) the demo in ``out``; returns the report's results dict. ``scale``:
    ``full`` or ``smoke`` (:data:`attnlab.demo.plan.SCALES`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    demo = Demo(out, SCALES[scale], budget_minutes * 60.0, device, progress)
    names = ["probe", *TRAINED, *STUDENTS, "bench", "report"]
    with logging_redirect_tqdm(), tqdm(total=len(names), desc="demo", unit="stage",
                                       disable=not progress, dynamic_ncols=True) as bar:

        def stage(name: str, fn: Callable[[], Any]) -> Any:
            bar.set_postfix_str(name)
            result = demo.timed(name, fn)
            bar.update(1)
            return result

        step_s = stage("probe", demo.probe)
        plan = demo.plan(step_s)
        for name in TRAINED:
            stage(name, lambda n=name: demo.train_model(n, plan["train_steps"]))
        distill_steps = demo.plan_distill(plan, step_s)
        for name in STUDENTS:
            stage(name, lambda n=name: demo.distill_student(n, distill_steps))
        stage("bench", demo.bench)
        return stage("report", demo.report)
