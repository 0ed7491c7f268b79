"""The run skeleton shared by ``attnlab train`` and ``attnlab distill``.

A loop file (:mod:`attnlab.train.loop`, :mod:`attnlab.distill.loop`) builds its model and
optimizer, then hands one function, *one optimizer step*, to :class:`Runner`, which owns
everything around it: the progress bar, the logged loss window, evaluation and checkpoint
cadence, the divergence guard, the pause point and Ctrl-C / SIGTERM. :class:`RunFolder` owns
the output folder's lifecycle:

- nothing is written before the config is validated and the model built (a config that
  fails leaves no folder, so the same ``--out`` works once it is fixed);
- ``--resume`` on a folder with no run says so; a new run never overwrites one;
- ``--resume`` with a changed config rewrites the config file to what really runs and
  appends what changed, and at which step, to ``config_changes.jsonl``;
- a new run that fails before its first checkpoint removes the folder it created;
- resuming a finished run returns its summary and appends nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import resource
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from attnlab.train.checkpoint import latest_checkpoint
from attnlab.utils.io import atomic_write_text, unwritable_reason
from attnlab.utils.outputs import describe_folder
from attnlab.utils.readers import read_json, read_jsonl

logger = logging.getLogger(__name__)

CHANGES = "config_changes.jsonl"
STOP_SIGNALS = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
RUN_KINDS = {"distill.yaml": "distillation", "config.yaml": "run"}
"""The file that marks each kind of run folder (a distillation of an attnlab teacher holds
``config.yaml`` too, so its own file is looked for first)."""
COMMANDS = {"run": "train", "distillation": "distill"}
"""The command that runs (and resumes) each kind."""
SUMMARY_FORMAT = "a run's summary (a JSON object written when attnlab train or distill ends)"
METRICS_FORMAT = "a run's log: one JSON object per line, each with its step"
LINE_HINT = "; fix or remove that line"


class RunDirError(RuntimeError):
    """The output folder already holds a run, holds none to resume, or cannot be written."""


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


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train.lr": 3e-4, ...}`` of a nested mapping."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def run_kind(path: Path) -> str | None:
    """The kind of run folder ``path`` is (``"run"``, ``"distillation"``), or None."""
    return next((kind for marker, kind in RUN_KINDS.items() if (path / marker).is_file()), None)


def resume_command(path: Path, kind: str) -> str:
    """The command line that continues the ``kind`` in ``path``."""
    return f"attnlab {COMMANDS[kind]} --out {path} --resume"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl`` (none before the first); ``ValueError``
    naming a damaged line."""
    path = run_dir / "metrics.jsonl"
    return read_jsonl(path, METRICS_FORMAT, LINE_HINT, keys=("step",)) if path.is_file() else []


class RunFolder:
    """The output folder of one run; ``config_name`` marks that it holds one.

    ``check`` runs before any work (it writes nothing); ``create`` once the model is built.
    On non-main ranks of a multi-process job every write is skipped. A new run needs an
    absent or empty folder; ``force`` lets it start beside other files (never over a run).
    """

    def __init__(self, path: str | Path, config_name: str, kind: str, *, resume: bool,
                 main: bool = True, force: bool = False) -> None:
        self.path, self.config_name, self.kind = Path(path), config_name, kind
        self.resume, self.main, self.force = resume, main, force
        self.existed = self.path.exists()

    @property
    def config_path(self) -> Path:
        return self.path / self.config_name

    def check(self) -> None:
        """``RunDirError`` unless the folder can take this run (new) or holds one (resume),
        and can be written."""
        held = run_kind(self.path)
        if held is not None and held != self.kind:
            raise RunDirError(
                f"{self.path} holds a {held}, not a {self.kind}: continue it with "
                f"{resume_command(self.path, held)}"
                + ("" if self.resume else f", or choose another --out for a new {self.kind}"))
        has_run = self.config_path.exists() or (self.path / "checkpoints").exists()
        if self.resume and not has_run:
            raise RunDirError(
                f"--resume: there is no {self.kind} in {self.path} to resume (no "
                f"{self.config_name}); start one without --resume"
            )
        if not self.resume and has_run:
            raise RunDirError(f"{self.path} already holds a {self.kind}; pass --resume to "
                              "continue it, or choose another --out")
        if (not self.resume and not self.force and self.path.is_dir()
                and any(self.path.iterdir())):
            raise RunDirError(
                f"{self.path} already holds {describe_folder(self.path)}; a new {self.kind} "
                "needs an empty or new folder: choose another --out (or --force to start it "
                "beside those files)")
        if reason := unwritable_reason(self.path, folder=True):
            raise RunDirError(f"cannot write the {self.kind} to {self.path}: {reason}; choose "
                              "another --out")
        if self.resume:  # damaged logs are refused before anything is written or trained
            self.config_changes()
            read_metrics(self.path)

    def create(self) -> None:
        if self.main:
            self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, text: str, step: int) -> dict[str, dict[str, Any]]:
        """Write the resolved config ``text``; on resume, only when it changed, recording the
        change (``{key: {"from": old, "to": new}}``, returned) at ``step``."""
        if not self.main:
            return {}
        if not self.resume or not self.config_path.exists():
            atomic_write_text(self.config_path, text)
            return {}
        old, new = _flat(yaml.safe_load(self.config_path.read_text())), _flat(yaml.safe_load(text))
        changes = {key: {"from": old.get(key), "to": new.get(key)}
                   for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)}
        if changes:
            with open(self.path / CHANGES, "a") as fh:
                fh.write(json.dumps({"step": step, "changes": changes}) + "\n")
            atomic_write_text(self.config_path, text)
            logger.info("resumed at step %d with a changed config: %s", step, ", ".join(
                f"{k} {v['from']!r} -> {v['to']!r}" for k, v in changes.items()))
        return changes

    def check_kept(self, text: str, kept: dict[str, Any], why: str) -> None:
        """On resume, ``RunDirError`` (before anything is written) when the resolved config
        ``text`` changes a key of ``kept`` (flat key -> its value where the recorded config
        lacks it) from what the folder's config records: a setting the run cannot change, as
        ``why`` says."""
        if not self.resume or not self.config_path.exists():
            return
        old, new = _flat(yaml.safe_load(self.config_path.read_text())), _flat(yaml.safe_load(text))
        for key, default in kept.items():
            if (was := old.get(key, default)) != (got := new.get(key, default)):
                raise RunDirError(f"{key}: this {self.kind} runs with {was!r} (recorded in "
                                  f"{self.config_path}), not {got!r}: {why}")

    def config_changes(self) -> list[dict[str, Any]]:
        """Every resume's recorded changes, oldest first."""
        path = self.path / CHANGES
        if not path.exists():
            return []
        return read_jsonl(path, "each resume's config changes, one JSON object per line",
                          LINE_HINT, keys=("step", "changes"))

    def finished_summary(self, step: int, total_steps: int) -> dict[str, Any] | None:
        """The summary of a run resumed at its end (nothing left to do), else None."""
        path = self.path / "summary.json"
        if step < total_steps or not path.exists():
            return None
        summary = read_json(path, SUMMARY_FORMAT, f"; remove it and run "
                            f"{resume_command(self.path, self.kind)} to write it again")
        if summary.get("steps") != step:
            return None
        logger.info("%s already finished at step %d; nothing to do", self.path, step)
        return summary

    def discard_if_unfinished(self) -> None:
        """After a failure: remove the folder if this run created it and never checkpointed."""
        if self.main and not self.existed and self.path.is_dir() and latest_checkpoint(
                self.path) is None:
            shutil.rmtree(self.path, ignore_errors=True)

    @contextlib.contextmanager
    def lifetime(self) -> Iterator[None]:
        """Around a run: a failure (Ctrl-C included) before the first checkpoint of a new run
        leaves no folder behind."""
        try:
            yield
        except BaseException:
            self.discard_if_unfinished()
            raise


class MetricsLog:
    """Append-only ``metrics.jsonl`` (plus optional TensorBoard), truncated on resume to the
    records up to the resumed step."""

    def __init__(self, out_dir: Path, resume_step: int | None, tensorboard: bool = False
                 ) -> None:
        self.path = out_dir / "metrics.jsonl"
        kept: list[dict[str, Any]] = []
        if resume_step is not None and self.path.exists():
            kept = [record for record in read_metrics(out_dir) if record["step"] <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.written = {(r["step"], frozenset(r)) for r in kept}
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ImportError(
                    "train.tensorboard needs: pip install 'attnlab[tensorboard]'"
                ) from err
            self.writer = SummaryWriter(str(out_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (it has a ``step``) unless one with the same step and keys is
        already there (a final evaluation redone on resume)."""
        key = (record["step"], frozenset(record))
        if key in self.written:
            return
        self.written.add(key)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for name, value in record.items():
                if name != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(name, value, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


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
    """When the runner logs, evaluates and checkpoints (0 = never, except at the end)."""

    steps: int
    log_every: int
    eval_every: int
    ckpt_every: int


class Runner:
    """Calls ``step_fn(step)`` until ``cadence.steps``, with everything around it.

    ``save(step, state)`` writes a checkpoint (``state``: the runner's own, to hand back to
    :meth:`restore`); ``evaluate()`` returns the ``eval_*`` fields of one held-out
    evaluation; ``metrics`` is None on ranks that do not write. ``graceful_stop``: a first
    SIGINT / SIGTERM saves the step and raises :class:`RunInterrupted`.
    """

    def __init__(self, folder: RunFolder, cadence: Cadence, *, tokens_per_step: int,
                 save: Callable[[int, dict[str, Any]], None],
                 evaluate: Callable[[], dict[str, float]], metrics: MetricsLog | None,
                 what: str, divergence_hint: str, progress: bool = True,
                 graceful_stop: bool = True) -> None:
        self.folder, self.cadence, self.tokens_per_step = folder, cadence, tokens_per_step
        self._save, self.evaluate, self.metrics = save, evaluate, metrics
        self.what, self.divergence_hint = what, divergence_hint
        self.progress, self.graceful_stop = progress, graceful_stop
        self.step, self.tokens, self.wall = 0, 0, 0.0
        self.saved_step: int | None = None
        self.started = time.perf_counter()

    @property
    def wall_s(self) -> float:
        """Seconds since :meth:`run` started in this process (steps, evaluations, saves)."""
        return time.perf_counter() - self.started

    def state(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "train_wall_s": self.wall}

    def restore(self, step: int, state: dict[str, Any]) -> None:
        """Continue from a checkpoint of ``step`` holding :meth:`state`."""
        self.step, self.saved_step = step, step
        self.tokens = state.get("tokens", step * self.tokens_per_step)
        self.wall = state.get("train_wall_s", state.get("wall_s", 0.0))

    def save(self) -> None:
        if self.saved_step != self.step:
            self._save(self.step, self.state())
            self.saved_step = self.step

    def log(self, record: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(record)

    def run(self, step_fn: Callable[[int], StepResult], pause_at: int | None = None) -> bool:
        """Train to the end (True) or to ``pause_at`` (False); a checkpoint at either."""
        c = self.cadence
        self.started = time.perf_counter()
        window: list[tuple[StepResult, float]] = []
        with stop_signals(self.graceful_stop) as stop, tqdm(
                total=c.steps, initial=self.step, disable=not self.progress, unit="step",
                dynamic_ncols=True) as bar:
            while self.step < c.steps:
                step_start = time.perf_counter()
                result = step_fn(self.step)
                elapsed = time.perf_counter() - step_start
                self._check_finite(result.values)
                self.step += 1
                self.tokens += self.tokens_per_step
                self.wall += elapsed
                window.append((result, elapsed))
                if self.step % c.log_every == 0 or self.step == c.steps:
                    record = self._window_record(window)
                    self.log(record)
                    bar.set_postfix(loss=f"{record['loss']:.3f}",
                                    tok_s=f"{record['tokens_per_s']:.0f}")
                    window = []
                if c.eval_every and self.step % c.eval_every == 0 and self.step < c.steps:
                    result_eval = self.evaluate()
                    self.log({"step": self.step, **result_eval})
                    logger.info("step %d: %s", self.step, ", ".join(
                        f"{k} {v:.4g}" for k, v in result_eval.items()))
                if c.ckpt_every and self.step % c.ckpt_every == 0:
                    self.save()
                bar.update(1)
                if "signum" in stop:
                    self.save()
                    raise RunInterrupted(stop["signum"], self.step, self.folder.path)
                if pause_at is not None and pause_at <= self.step < c.steps:
                    self.save()
                    return False
        self.save()
        return True

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
