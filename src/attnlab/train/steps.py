"""The bookkeeping around each optimizer step, shared by ``attnlab train`` and ``attnlab distill``.

A step loop (:func:`attnlab.train.loop.run_steps`, or :meth:`attnlab.train.runner.Runner.run`
for a step function) keeps its place in a :class:`StepTracker`: the step, tokens and training
seconds a checkpoint carries, the progress bar, the logged loss window, the evaluation and
checkpoint cadence (:class:`Cadence`), the divergence guard (:class:`TrainingDiverged`), the
pause point, and Ctrl-C / SIGTERM (:class:`RunInterrupted`, after saving the step).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from attnlab.train.checkpoint import latest_checkpoint

if TYPE_CHECKING:
    from attnlab.train.runner import MetricsLog, RunFolder

logger = logging.getLogger(__name__)

STOP_SIGNALS = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run after a step; a checkpoint of that step was saved.

    ``exit_code`` is the shell's convention for the signal (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int, step: int, folder: Path) -> None:
        self.signum, self.step, self.folder = signum, step, folder
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {STOP_SIGNALS[signum]} after step {step}; its checkpoint "
                         f"is saved in {folder}")


@contextlib.contextmanager
def stop_signals(enabled: bool) -> Iterator[dict[str, int]]:
    """While inside: the first SIGINT / SIGTERM is recorded (``flag["signum"]``) instead of
    stopping the process, so the step in progress can finish and be saved; a second one
    stops at once. Only in the main thread, and only when ``enabled``."""
    flag: dict[str, int] = {}
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def record(signum: int, frame: Any) -> None:
        flag["signum"] = signum
        for other, handler in previous.items():
            signal.signal(other, handler)
        logger.warning("%s: finishing this step, then saving a checkpoint (again to stop at "
                       "once)", STOP_SIGNALS[signum])

    for signum in STOP_SIGNALS:
        signal.signal(signum, record)
    try:
        yield flag
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclasses.dataclass
class StepResult:
    """What one optimizer step reports: ``values`` (``"loss"`` first) are averaged over the
    log window and logged, and the run stops when one is NaN or infinite; ``lr`` its rate."""

    values: dict[str, float]
    lr: float


@dataclasses.dataclass
class Cadence:
    """When a step loop logs, evaluates and checkpoints (0 = never, except at the end)."""

    steps: int
    log_every: int
    eval_every: int
    ckpt_every: int


class StepTracker:
    """Where a run is (step, tokens, training seconds) and the bookkeeping around each step.

    A step loop runs inside :meth:`session` (the progress bar; SIGINT / SIGTERM) and, after
    each step, calls :meth:`count` with its :class:`StepResult`, :meth:`log_eval` when
    :meth:`eval_due`, :meth:`save` when :meth:`ckpt_due`, then :meth:`end_step`; and
    :meth:`save` once more after the last step. ``save(step, state)`` writes a checkpoint
    (``state``: the tracker's own, to hand back to :meth:`restore`); ``metrics`` is None on
    ranks that do not write. ``graceful_stop``: a first SIGINT / SIGTERM saves the step and
    raises :class:`RunInterrupted`.
    """

    def __init__(self, folder: RunFolder, cadence: Cadence, *, tokens_per_step: int,
                 save: Callable[[int, dict[str, Any]], None], metrics: MetricsLog | None,
                 what: str, divergence_hint: str, progress: bool = True,
                 graceful_stop: bool = True) -> None:
        self.folder, self.cadence, self.tokens_per_step = folder, cadence, tokens_per_step
        self._save, self.metrics = save, metrics
        self.what, self.divergence_hint = what, divergence_hint
        self.progress, self.graceful_stop = progress, graceful_stop
        self.step, self.tokens, self.wall = 0, 0, 0.0
        self.saved_step: int | None = None
        self.started = time.perf_counter()
        self._window: list[tuple[StepResult, float]] = []
        self._stop: dict[str, int]  # set by session()
        self._bar: tqdm  # set by session()

    @property
    def wall_s(self) -> float:
        """Seconds since :meth:`session` started in this process (steps, evaluations, saves)."""
        return time.perf_counter() - self.started

    def state(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "train_wall_s": self.wall}

    def restore(self, step: int, state: dict[str, Any]) -> None:
        """Continue from a checkpoint of ``step`` holding :meth:`state`."""
        self.step, self.saved_step = step, step
        self.tokens = state.get("tokens", step * self.tokens_per_step)
        self.wall = state.get("train_wall_s", state.get("wall_s", 0.0))

    def save(self) -> None:
        """Checkpoint this step, unless it is saved already."""
        if self.saved_step != self.step:
            self._save(self.step, self.state())
            self.saved_step = self.step

    def log(self, record: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(record)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Around the step loop: the progress bar, and the first SIGINT / SIGTERM recorded
        (when ``graceful_stop``) rather than fatal; :attr:`wall_s` counts from here."""
        self.started = time.perf_counter()
        self._window = []
        with stop_signals(self.graceful_stop) as self._stop, tqdm(
                total=self.cadence.steps, initial=self.step, disable=not self.progress,
                unit="step", dynamic_ncols=True) as self._bar:
            yield

    def count(self, result: StepResult, seconds: float) -> None:
        """The step just done, in ``seconds``: :class:`TrainingDiverged` if a value is NaN or
        infinite, else it counts, and every ``log_every`` steps (and at the last) the window's
        record is logged."""
        self._check_finite(result.values)
        self.step += 1
        self.tokens += self.tokens_per_step
        self.wall += seconds
        self._window.append((result, seconds))
        if self.step % self.cadence.log_every == 0 or self.step == self.cadence.steps:
            record = self._window_record(self._window)
            self.log(record)
            self._bar.set_postfix(loss=f"{record['loss']:.3f}",
                                  tok_s=f"{record['tokens_per_s']:.0f}")
            self._window = []

    def eval_due(self) -> bool:
        """Whether a periodic evaluation follows this step (none after the last: the run's
        final evaluation comes after the loop)."""
        every = self.cadence.eval_every
        return bool(every) and self.step % every == 0 and self.step < self.cadence.steps

    def ckpt_due(self) -> bool:
        """Whether a periodic checkpoint follows this step."""
        every = self.cadence.ckpt_every
        return bool(every) and self.step % every == 0

    def log_eval(self, values: dict[str, float]) -> None:
        """Log a periodic evaluation's ``eval_*`` values at this step."""
        self.log({"step": self.step, **values})
        logger.info("step %d: %s", self.step, ", ".join(
            f"{k} {v:.4g}" for k, v in values.items()))

    def end_step(self, pause_at: int | None = None) -> bool:
        """The step is over: the bar moves on; after a SIGINT / SIGTERM the step is saved and
        :class:`RunInterrupted` raised; at ``pause_at`` (before the end) it is saved and the
        answer is True (stop here)."""
        self._bar.update(1)
        if "signum" in self._stop:
            self.save()
            raise RunInterrupted(self._stop["signum"], self.step, self.folder.path)
        if pause_at is not None and pause_at <= self.step < self.cadence.steps:
            self.save()
            return True
        return False

    def _check_finite(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            if math.isfinite(value):
                continue
            last = latest_checkpoint(self.folder.path) if self.folder.path.exists() else None
            raise TrainingDiverged(
                f"{self.what} {name} became {value} at step {self.step}; stopping. The last good "
                f"checkpoint is {last or 'none (no checkpoint written yet)'}. "
                f"{self.divergence_hint}"
            )

    def _window_record(self, window: list[tuple[StepResult, float]]) -> dict[str, Any]:
        """The logged record: the window's mean values, the last rate, throughput."""
        n = len(window)
        record: dict[str, Any] = {"step": self.step}
        for key in window[-1][0].values:
            record[key] = sum(r.values[key] for r, _ in window) / n
        seconds = sum(t for _, t in window)
        record.update(lr=window[-1][0].lr, tokens=self.tokens,
                      tokens_per_s=n * self.tokens_per_step / max(seconds, 1e-9),
                      wall_s=self.wall_s)
        return record
