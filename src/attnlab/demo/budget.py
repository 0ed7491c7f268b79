"""The demo's time budget: what each stage took against what was planned for it, the pace
that follows, and what to say when the rest no longer fits."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class Budget:
    """``budget_s`` seconds from now by ``clock`` (``time.perf_counter`` by default; tests
    inject a slow one). ``strict``: keep the budget rather than the stages' minimums."""

    def __init__(self, budget_s: float, strict: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not (math.isfinite(budget_s) and budget_s > 0):  # inf: no plan; nan: no comparison
            raise ValueError(f"the budget must be a finite number of seconds > 0, got "
                             f"{budget_s}")
        self.budget_s, self.strict, self.clock = budget_s, strict, clock
        self.start = clock()
        self.stages_s: dict[str, float] = {}  # stage -> seconds it took
        self.runs_s: dict[str, float] = {}  # training run -> seconds it took (runs may overlap)
        self.planned_s: dict[str, float] = {}  # stage or run -> seconds planned for it
        self.announced_over_s = 0.0

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float:
        """Seconds of the budget left."""
        return self.budget_s - self.elapsed()

    def pace(self) -> float:
        """Taken over planned seconds of the finished stages and runs that had a plan (1
        before any): how much slower than the probe predicted the work runs."""
        taken = {**self.stages_s, **self.runs_s}
        done = [n for n in self.planned_s if n in taken]
        planned = sum(self.planned_s[n] for n in done)
        return sum(taken[n] for n in done) / planned if planned else 1.0

    def record_run(self, name: str, seconds: float) -> None:
        """Training run ``name`` took ``seconds`` (inside a stage, maybe beside other runs)."""
        self.runs_s[name] = seconds
        planned = self.planned_s.get(name)
        logger.info("run %s: %.1f s%s; %.0f s of the budget left", name, seconds,
                    f" (planned {planned:.0f} s)" if planned else "", self.remaining())

    def timed(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its seconds recorded as stage ``name``."""
        start = self.clock()
        result = fn()
        self.stages_s[name] = self.clock() - start
        planned = self.planned_s.get(name)
        logger.info("stage %s: %.1f s%s; %.0f s of the budget left", name, self.stages_s[name],
                    f" (planned {planned:.0f} s)" if planned else "", self.remaining())
        return result

    def overrun(self, rest_s: float, what: str) -> str | None:
        """When ``what`` (the remaining stages at their minimums, ``rest_s`` seconds at the
        measured pace) no longer fits in the budget: the decision to announce, once, and again
        only when the overrun has grown by a quarter; else None."""
        over = rest_s - self.remaining()
        if over <= 0 or over < 1.25 * self.announced_over_s:
            return None
        self.announced_over_s = over
        head = (f"{what} need ~{rest_s:.0f} s at the pace measured so far (x{self.pace():.2f} "
                f"the probe's), {max(0.0, self.remaining()):.0f} s of the budget are left")
        if self.strict:
            return (f"{head}: keeping the budget (--strict-budget); stages that cannot reach "
                    "their minimum will be marked inconclusive")
        return f"{head}: keeping every stage at its minimum, over the budget by ~{over:.0f} s"
