"""Stage 5, with a large enough budget: the real-model stage (what it runs and how it resumes:
:class:`attnlab.demo.real_model.RealModel`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.config import ConfigError
from attnlab.demo.plan import REAL_MODEL_MINUTES, SPEED_PROBE, real_model_seconds
from attnlab.demo.real_model import RealModel
from attnlab.demo.stages.base import Stage

if TYPE_CHECKING:
    from attnlab.demo.context import Demo


class RealModelStage(Stage):
    """The scale's real-model stage if it runs (:attr:`real`; ``choice``: ``auto``, ``on`` or
    ``off``, :data:`~attnlab.demo.plan.REAL_MODEL_CHOICES`), and :attr:`note`, a sentence for
    the report either way. ``ConfigError`` before any work when it was asked for (``on``)
    under a strict budget shorter than the stage alone takes on the reference machine, or on
    a machine that cannot run it."""

    name = "real-model"

    def __init__(self, demo: Demo, choice: str) -> None:
        super().__init__(demo)
        self.real, self.note = self.choose(choice)

    def choose(self, choice: str) -> tuple[RealModel | None, str]:
        """``(the stage if it runs, the report's sentence)`` for ``choice``."""
        real, budget = self.demo.scale.real_model, self.demo.budget
        need_s = real.reference_s + self.demo.scale.report_reserve_s
        if choice == "on" and budget.strict and budget.budget_s < need_s:
            raise ConfigError(
                f"--strict-budget --budget-minutes {budget.budget_s / 60:g} cannot fit the "
                f"real-model stage that --real-model on asks for: it alone needs ~"
                f"{need_s / 60:.3g} minutes on the reference machine (2 CPU cores); give a "
                "larger --budget-minutes, or leave out --strict-budget or --real-model on")
        if choice == "off" or (choice == "auto" and
                               budget.budget_s < REAL_MODEL_MINUTES * 60 - 1e-6):
            return None, (f"The real-model stage ({real.name}) did not run: it needs "
                          f"--budget-minutes {REAL_MODEL_MINUTES:.0f} (or --real-model on).")
        if (why := real.missing()) is not None:
            if choice == "on":
                raise ConfigError(f"the real-model stage cannot run: {why}")
            return None, f"The real-model stage ({real.name}) did not run: {why}."
        return real, real.describe()

    def minimum_s(self) -> float:
        """Seconds reserved for the stage (0 when it does not run)."""
        if self.real is None:
            return 0.0
        return real_model_seconds(self.real, self.demo.probe.step_s[SPEED_PROBE])

    def plan(self) -> None:
        """At its fixed sizes, the stage takes what it takes; with ``strict_budget``, it is
        skipped (and said) when the time left cannot cover it."""
        demo, budget = self.demo, self.demo.budget
        assert self.real is not None  # the stage runs
        need_s = budget.pace() * self.minimum_s() + demo.report.minimum_s()
        if budget.strict and need_s > budget.remaining():
            decision = (f"skipping the real-model stage ({self.real.name}): it needs ~"
                        f"{need_s:.0f} s at the pace measured so far, "
                        f"{max(0.0, budget.remaining()):.0f} s are left (--strict-budget)")
            demo.decide(decision)
            self.real, self.note = None, f"The real-model stage was skipped: {decision}."
            return
        budget.planned_s[self.name] = self.minimum_s()
        demo.check_the_rest(need_s, "the real-model stage")

    def run(self, part: str) -> None:
        """The stage's three steps (:meth:`attnlab.demo.real_model.RealModel.run`), unless its
        plan skipped it."""
        if self.real is not None:
            self.real.run(self.demo.out, self.demo.device, self.demo.progress)
