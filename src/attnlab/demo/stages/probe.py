"""Stage 1, the probe: ``probe.json``, one training step of every model side by side (bench
JSON), and how many models train at once (on a CPU, from a second probe of that arrangement;
:mod:`attnlab.demo.parallel`)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from attnlab.bench import train_step
from attnlab.demo.parallel import probe_concurrently
from attnlab.demo.plan import STUDENTS, TRAINED, Lanes, train_seconds
from attnlab.demo.stages.base import Stage
from attnlab.results import read_json

if TYPE_CHECKING:
    from attnlab.demo.context import Demo

logger = logging.getLogger(__name__)


def _step_s(paths: list[Path]) -> dict[str, float]:
    """Seconds per step of every probed config in the bench JSON files ``paths``: the midpoint
    of its median and fastest step."""
    return {r.name: (r.ms_median + r.ms_min) / 2e3 for path in paths for r in read_json(path)[1]}


class ProbeStage(Stage):
    """Seconds per training step of every model and student architecture (:attr:`step_s`),
    and the lanes the models train on (:attr:`lanes`, :attr:`train_step_s`).

    ``train_jobs``: how many models may train at once (None: on a CPU as many as there are
    threads, one thread each, at most one per model, :meth:`choose_lanes` then deciding from
    a probe; on a GPU one at a time)."""

    name = "probe"

    def __init__(self, demo: Demo, train_jobs: int | None) -> None:
        super().__init__(demo)
        self.cores = 1 if demo.cuda else torch.get_num_threads()  # training lanes' share
        self.forced = train_jobs is not None
        self.jobs = train_jobs if train_jobs is not None else (
            1 if demo.cuda else max(1, min(len(TRAINED), self.cores)))
        self.threads = max(1, self.cores // self.jobs)
        self.step_s: dict[str, float] = {}
        self.lanes = Lanes()  # one at a time until the probes say otherwise
        self.train_step_s: dict[str, float] = {}
        self.choice: dict[str, Any] = {}

    def run(self, part: str) -> None:
        """The probe: the midpoint of each model's median and fastest probed step. On the
        reference machine the median overestimated the pace of the training that followed by
        up to 15% and the fastest step underestimated it by up to 9%, the midpoint was within
        5% (dense-h8's probe in three demos: median 217 / 259 / 287 ms, fastest 205 / 244 /
        218, its run's steps 223 / 246 / 248)."""
        demo, path = self.demo, self.demo.out / "probe.json"
        if not self.reused(self.name, path):
            cfgs = {**{name: demo.trained_config(name) for name in TRAINED},
                    **{name: demo.config(src) for name, src in STUDENTS.items()}}
            train_step.run_configs(cfgs, steps=demo.scale.probe_reps, json_path=path,
                                   device=demo.device)
        self.step_s = _step_s([path])
        self.choose_lanes()

    def choose_lanes(self) -> None:
        """One model at a time on every thread, or :attr:`jobs` at once on :attr:`threads`
        each: a second probe times the trained models in that arrangement (one process per
        lane; its step times are kept in ``plan.json``'s ``lanes_choice``), and the models
        train together when it predicts their training sooner, or when ``train_jobs`` asked
        for it (a resumed demo keeps its plan's choice). Sets :attr:`lanes` and
        :attr:`train_step_s`, the step times to plan with."""
        self.train_step_s = {n: self.step_s[n] for n in TRAINED}
        if self.jobs == 1:
            return
        order = sorted(TRAINED, key=lambda name: -self.step_s[name])  # slowest first
        if self.demo.plan_path.is_file():
            plan = self.demo.read_plan()
            self.choice = plan.get("lanes_choice") or {}
            chosen = plan.get("train_jobs", 1) > 1
        else:
            chosen = self.probe_together(order)
        if chosen:
            self.lanes = self.together_lanes
            self.train_step_s = {n: self.choice["together_step_s"][n] for n in order}

    def probe_together(self, order: list[str]) -> bool:
        """The second probe, the models of ``order`` dealt to :attr:`jobs` lanes in turn
        (slowest first: even lanes); whether they train together (:attr:`choice` says why)."""
        demo, jobs = self.demo, self.jobs
        with tempfile.TemporaryDirectory(dir=demo.out) as tmp:
            paths = [Path(tmp) / f"lane-{i}.json" for i in range(jobs)]
            probe_concurrently([{n: demo.trained_config(n) for n in order[i::jobs]}
                                for i in range(jobs)], demo.scale.together_reps,
                               self.threads, paths)
            together = _step_s(paths)
        alone_s = train_seconds(self.train_step_s, 100, demo.scale, demo.tokens_per_step)
        together_s = train_seconds({n: together[n] for n in order}, 100, demo.scale,
                                   demo.tokens_per_step, self.together_lanes)
        chosen = self.forced or together_s < alone_s
        self.choice = {"alone_s_per_100_steps": alone_s,
                       "together_s_per_100_steps": together_s, "together": chosen,
                       "together_step_s": together}
        logger.info("probe: 100 steps of every model take ~%.0f s one at a time, ~%.0f s "
                    "%d at a time: training %s", alone_s, together_s, jobs,
                    f"{jobs} at a time" if chosen else "one at a time")
        return chosen

    @property
    def together_lanes(self) -> Lanes:
        """:attr:`jobs` runs at once, as many at full speed as the threads allow."""
        return Lanes(self.jobs, max(1, self.cores // self.threads))
