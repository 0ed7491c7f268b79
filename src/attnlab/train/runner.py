"""The run skeleton shared by ``attnlab train`` and ``attnlab distill``.

:class:`RunFolder` owns the output folder's lifecycle, :class:`MetricsLog` its
``metrics.jsonl``, and :class:`Runner` runs a step loop around one function, *one optimizer
step* (:mod:`attnlab.distill.loop`); :mod:`attnlab.train.loop` writes its own loop around the
same bookkeeping (:class:`~attnlab.train.steps.StepTracker`: progress bar, logged loss
window, evaluation and checkpoint cadence, divergence guard, pause point, Ctrl-C / SIGTERM).
The folder's rules:

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
import json
import logging
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from attnlab.train.checkpoint import latest_checkpoint
from attnlab.train.steps import Cadence, StepResult, StepTracker
from attnlab.utils.io import atomic_write_text, unwritable_reason
from attnlab.utils.outputs import describe_folder
from attnlab.utils.readers import read_json, read_jsonl

logger = logging.getLogger(__name__)

CHANGES = "config_changes.jsonl"
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


class Runner(StepTracker):
    """A :class:`StepTracker` that runs the step loop itself: :meth:`run` calls
    ``step_fn(step)`` until ``cadence.steps``; ``evaluate()`` returns the ``eval_*`` fields
    of one held-out evaluation."""

    def __init__(self, folder: RunFolder, cadence: Cadence, *, tokens_per_step: int,
                 save: Callable[[int, dict[str, Any]], None],
                 evaluate: Callable[[], dict[str, float]], metrics: MetricsLog | None,
                 what: str, divergence_hint: str, progress: bool = True,
                 graceful_stop: bool = True) -> None:
        super().__init__(folder, cadence, tokens_per_step=tokens_per_step, save=save,
                         metrics=metrics, what=what, divergence_hint=divergence_hint,
                         progress=progress, graceful_stop=graceful_stop)
        self.evaluate = evaluate

    def run(self, step_fn: Callable[[int], StepResult], pause_at: int | None = None) -> bool:
        """Train to the end (True) or to ``pause_at`` (False); a checkpoint at either."""
        with self.session():
            while self.step < self.cadence.steps:
                start = time.perf_counter()
                self.count(step_fn(self.step), time.perf_counter() - start)
                if self.eval_due():
                    self.log_eval(self.evaluate())
                if self.ckpt_due():
                    self.save()
                if self.end_step(pause_at):
                    return False
        self.save()
        return True
