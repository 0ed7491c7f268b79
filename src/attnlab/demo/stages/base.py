"""What every stage of the demo is: a name, a minimum, a plan, its work, and how it resumes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnlab.demo.context import Demo

logger = logging.getLogger(__name__)


class Stage:
    """One stage of ``demo`` (:attr:`attnlab.demo.context.Demo.stages` lists them in order).
    The driver (:func:`attnlab.demo.run.run_demo`) calls :meth:`plan`, then :meth:`run` for
    each of its :attr:`parts`, each timed by the budget as a stage of that name. What a stage
    finished in an earlier invocation of the demo it reuses (:meth:`reused`), and what it
    started it resumes."""

    name: str
    """The stage's name in the messages (its only part's, unless it has several)."""

    def __init__(self, demo: Demo) -> None:
        self.demo = demo

    @property
    def parts(self) -> tuple[str, ...]:
        """What the budget times and the progress bar counts, one after the other: the stage
        itself, unless it runs in several parts."""
        return (self.name,)

    def minimum_s(self) -> float:
        """Seconds the stage needs at its minimum, at the probe's pace: what the stages
        planned before it keep for it (0 by default: nothing before it plans)."""
        return 0.0

    def later_minimum_s(self) -> float:
        """Seconds the stages after this one need at their minimums, at the probe's pace."""
        stages = self.demo.stages
        return sum(stage.minimum_s() for stage in stages[stages.index(self) + 1:])

    def plan(self) -> None:
        """Before the stage runs: its share of the time left, and what the demo does when the
        rest no longer covers every stage's minimum (nothing by default)."""

    def run(self, part: str) -> Any:
        """The work of ``part`` (one of :attr:`parts`), resuming what an earlier invocation
        left."""
        raise NotImplementedError

    def reused(self, what: str, path: Path, marker: Path | None = None) -> bool:
        """Whether ``path`` (its ``marker`` file, by default itself) was finished by an earlier
        invocation of the demo; then it is reused, and the message says so."""
        if not (marker or path).is_file():
            return False
        logger.info("%s: finished earlier, reusing %s", what, path)
        return True

    def reused_run(self, name: str, run_dir: Path) -> bool:
        """Whether run ``name`` (training or distillation) finished in an earlier invocation
        (then it is reused, and its planned seconds, which say nothing of the pace, go)."""
        if not self.reused(name, run_dir, run_dir / "summary.json"):
            return False
        self.demo.budget.planned_s.pop(name, None)
        return True
