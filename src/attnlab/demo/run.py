"""``attnlab demo``: every stage of the main job, resumable, within a time budget.

Stages (:mod:`attnlab.demo.stages`, one module each), each leaving its result in ``out``
(atomically, so an interrupted demo re-run picks up finished stages and resumes a half-done
run from its last checkpoint):

1. ``probe.json``: one training step of every model, side by side (bench JSON), and how many
   models train at once (a second probe; :mod:`~attnlab.demo.stages.probe`);
2. ``plan.json``: the steps the budget allows (training, re-planned once after the first
   warm-ups; distillation once it starts), and every decision taken when the measured pace
   could not cover a stage's minimum; ``runs/<model>/``: each model of
   :data:`~attnlab.demo.plan.TRAINED` trained on the same tokens, on a CPU several at once
   (:mod:`~attnlab.demo.stages.train`);
3. ``runs/<student>/``: SEA and Performer distilled from the RoPE teacher
   (:mod:`~attnlab.demo.stages.distill`);
4. ``bench-attention-layers.json``: attention layers against sequence length
   (:mod:`~attnlab.demo.stages.bench`);
5. with a large enough budget, the real-model stage (:mod:`~attnlab.demo.stages.real_model`);
6. ``demo.json``, then ``report.md``, the PNGs and ``results.json``
   (:mod:`~attnlab.demo.stages.report`).

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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from attnlab.demo.budget import Budget
from attnlab.demo.context import Demo
from attnlab.demo.plan import BUDGET_MINUTES, SCALES
from attnlab.utils.outputs import OutputFolder

__all__ = ["Demo", "run_demo"]


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
    demo's own folder resumes it).

    Every stage of :attr:`Demo.stages` in turn plans (:meth:`~attnlab.demo.stages.base.Stage.
    plan`, from the pace measured so far), then runs its parts, each timed by the budget."""
    destination = OutputFolder.of(out, "demo", force=force)
    destination.check()
    out = Path(out)
    budget = Budget(budget_minutes * 60.0, strict_budget, clock)
    demo = Demo(out, SCALES[scale], budget, device, progress, precision, train_jobs,
                real_model)
    destination.claim()
    results: dict[str, Any] = {}  # what each part returned
    parts = sum(len(stage.parts) for stage in demo.stages)
    with logging_redirect_tqdm(), tqdm(total=parts, desc="demo", unit="stage",
                                       disable=not progress, dynamic_ncols=True) as bar:
        for stage in demo.stages:
            stage.plan()
            for part in stage.parts:
                bar.set_postfix_str(part)
                results[part] = budget.timed(part, functools.partial(stage.run, part))
                bar.update(1)
    return results["report"]
