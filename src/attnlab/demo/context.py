"""One invocation of the demo: its settings, what its stages share (configs, ``plan.json``,
the decisions taken when the time left no longer covers every minimum) and its stages, in
the order they run (:mod:`attnlab.demo.stages`)."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import torch

from attnlab.config import builtin_config
from attnlab.demo.budget import Budget
from attnlab.demo.plan import BASELINE, PRECISIONS, REAL_MODEL_CHOICES, TRAINED, Scale
from attnlab.demo.real_model import RealModel
from attnlab.demo.stages import (
    BenchStage,
    DistillStage,
    ProbeStage,
    RealModelStage,
    ReportStage,
    Stage,
    TrainStage,
)
from attnlab.train import load_run_config
from attnlab.train.config import RunConfig
from attnlab.utils import readers
from attnlab.utils.io import atomic_write_json
from attnlab.utils.precision import native_bf16

logger = logging.getLogger(__name__)


class Demo:
    """One invocation of the demo in ``out``, timed by ``budget``: its settings, its stages
    (:attr:`stages`), and :attr:`plan`, what ``plan.json`` holds once the training stage has
    planned (:meth:`attnlab.demo.stages.train.TrainStage.plan`)."""

    def __init__(self, out: Path, scale: Scale, budget: Budget, device: str,
                 progress: bool, precision: str = "auto", train_jobs: int | None = None,
                 real_model: str = "off") -> None:
        for option, value, choices in (("precision", precision, PRECISIONS),
                                       ("real_model", real_model, REAL_MODEL_CHOICES)):
            if value not in choices:
                raise ValueError(f"{option} must be one of {', '.join(choices)}, "
                                 f"got {value!r}")
        if train_jobs is not None and train_jobs < 1:
            raise ValueError(f"train_jobs must be at least 1, got {train_jobs}")
        self.out, self.scale, self.budget, self.progress = out, scale, budget, progress
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" \
            else device
        self.cuda = self.device.startswith("cuda")
        self.bf16 = precision == "bf16" or (precision == "auto" and native_bf16(self.device))
        self.precision = "bf16" if self.bf16 else "fp32"
        self.load_start = os.getloadavg()[0]
        self.plan: dict[str, Any] = {}
        self.probe = ProbeStage(self, train_jobs)
        self.training = TrainStage(self)
        self.distillation = DistillStage(self)
        self.bench = BenchStage(self)
        self.real_model = RealModelStage(self, real_model)
        self.report = ReportStage(self)
        self.stages: list[Stage] = [  # those that run, in order
            self.probe, self.training, self.distillation, self.bench,
            *([self.real_model] if self.real is not None else []), self.report]

    @property
    def real(self) -> RealModel | None:
        """The real-model stage's model, None when the stage does not run."""
        return self.real_model.real

    @property
    def real_note(self) -> str:
        """What the report says of the real-model stage, run or not."""
        return self.real_model.note

    def config(self, source: str, overrides: tuple[str, ...] = ()) -> RunConfig:
        """A built-in config with the scale's and the given overrides, on the demo's device."""
        return load_run_config(builtin_config(source), [
            *self.scale.overrides, *overrides, f"train.device={self.device}"])

    def trained_config(self, name: str, overrides: tuple[str, ...] = ()) -> RunConfig:
        """The config model ``name`` of :data:`~attnlab.demo.plan.TRAINED` trains with (bf16
        autocast if the demo trains in bf16; distillation and the benchmark stay in
        float32)."""
        return self.config(TRAINED[name], (f"train.bf16={str(self.bf16).lower()}", *overrides))

    @functools.cached_property
    def tokens_per_step(self) -> int:
        """Training tokens per step of every trained model."""
        t = self.config(TRAINED[BASELINE]).train
        return t.batch_size * t.seq_len * t.grad_accum

    @property
    def plan_path(self) -> Path:
        """``plan.json``: the plan, its re-plans and decisions (the demo's own file)."""
        return self.out / "plan.json"

    def read_plan(self) -> dict[str, Any]:
        """A resumed demo's ``plan.json``; ``ValueError`` naming it when it is damaged."""
        return readers.read_json(self.plan_path,
                                 "the demo's plan (a JSON object written by attnlab demo)",
                                 "; remove it and the demo plans again")

    def save_plan(self) -> None:
        """Write :attr:`plan` to ``plan.json`` (atomically: a resumed demo reads it whole)."""
        atomic_write_json(self.plan_path, self.plan)

    def decide(self, decision: str) -> None:
        """Announce what the demo does about a stage that no longer fits, and keep it in
        ``plan.json`` for the report."""
        logger.warning("demo: %s", decision)
        self.plan.setdefault("decisions", []).append(decision)
        self.save_plan()

    def check_the_rest(self, rest_s: float, what: str) -> None:
        """After a stage: if the rest (``rest_s`` at the measured pace) no longer fits, say
        what the demo does about it now (:meth:`decide`)."""
        decision = self.budget.overrun(rest_s, what)
        if decision is not None:
            self.decide(decision)
