"""Several training runs at once, each in its own process on its own CPU threads.

A step of the demo's tiny models may not keep two cores busy: on the reference machine (2-core
EPYC, bf16 autocast) dense-h8 took 287 ms per step on two threads and 416-433 ms on one thread
while a second one-thread run trained beside it, so two runs at once got ~1.35x the steps of
the same runs one after the other (docs/results/demo-lr-cpu); on another day of the same
machine only ~1.1x (docs/results/demo-parallel-cpu). Hence :func:`probe_concurrently`, which
measures the step times in that arrangement before the demo chooses it.

:func:`train_runs` starts up to ``jobs`` runs at once (``attnlab train`` run folders,
resumable as ever), each in a spawned process with ``threads`` torch threads, its log in
``<out_dir>.log``, and shows one progress bar for all of them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from attnlab.bench import train_step
from attnlab.train import train
from attnlab.train.config import RunConfig
from attnlab.utils.allocator import tune_cpu_allocator

logger = logging.getLogger(__name__)

POLL_S = 0.5


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: ``name`` (for messages), its config and folder, whether it resumes
    a started run, and the step to pause at (:func:`attnlab.train.train`)."""

    name: str
    cfg: RunConfig
    out_dir: Path
    resume: bool
    pause_at: int | None = None

    @property
    def log_path(self) -> Path:
        return self.out_dir.with_name(self.out_dir.name + ".log")

    def progress(self) -> dict:
        """The last training record of the run's ``metrics.jsonl`` (``{}`` before any)."""
        records = training_records(self.out_dir)
        return records[-1] if records else {}


def training_records(out_dir: Path) -> list[dict]:
    """The training records (loss, tokens per second) of a run's ``metrics.jsonl``."""
    try:
        lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the line being written
            continue
        if "loss" in record:
            records.append(record)
    return records


def measured_step_s(out_dir: Path, cfg: RunConfig) -> float | None:
    """The median seconds per training step of a run's logged windows after the first (which
    pays for start-up), or of the first when it is the only one; None before any."""
    records = training_records(out_dir)
    rates = [r["tokens_per_s"] for r in records[1:] or records]
    if not rates:
        return None
    t = cfg.train
    return t.batch_size * t.seq_len * t.grad_accum / sorted(rates)[len(rates) // 2]


class RunFailed(RuntimeError):
    """A training run's process ended with an error (its log says which)."""


def _train_in_child(run: Run) -> None:
    """A spawned process's work: train ``run``, everything it prints into its log."""
    with open(run.log_path, "a", buffering=1) as log:
        sys.stdout = sys.stderr = log
        logging.basicConfig(level=logging.INFO, stream=log, force=True,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        tune_cpu_allocator()  # as the demo's own process
        try:
            train(run.cfg, run.out_dir, resume=run.resume, progress=False,
                  pause_at=run.pause_at)
        except KeyboardInterrupt:  # Ctrl-C reaches every process of the terminal
            sys.exit(130)
        except BaseException as err:
            log.write(traceback.format_exc())
            log.write(f"{type(err).__name__}: {err}\n")  # the last line: what the parent says
            sys.exit(1)


def _probe_in_child(cfgs: dict[str, RunConfig], steps: int, threads: int,
                    json_path: Path) -> None:
    torch.set_num_threads(threads)
    tune_cpu_allocator()
    train_step.run_configs(cfgs, steps=steps, json_path=json_path)


def probe_concurrently(lanes: Sequence[dict[str, RunConfig]], steps: int, threads: int,
                       json_paths: Sequence[Path]) -> None:
    """A training step of every config when ``len(lanes)`` processes share the machine: each
    lane's configs are timed side by side (:func:`attnlab.bench.train_step.run_configs`,
    ``steps`` repetitions) in a process of its own on ``threads`` threads, every lane at once;
    lane ``i`` writes its bench JSON to ``json_paths[i]``."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_probe_in_child, args=(dict(cfgs), steps, threads, path),
                         name="attnlab-probe", daemon=True)
             for cfgs, path in zip(lanes, json_paths, strict=True)]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join()
    if failed := [p.exitcode for p in procs if p.exitcode != 0]:
        raise RunFailed(f"the concurrent probe failed (exit codes {failed})")


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


def train_runs(runs: Sequence[Run], jobs: int, threads: int, *, progress: bool = True,
               on_done: Callable[[Run, float], None] | None = None) -> dict[str, float]:
    """Train ``runs`` (in this order), up to ``jobs`` at once, each on ``threads`` torch
    threads in its own process; ``on_done(run, seconds)`` is called in this process as each
    finishes. Returns each run's wall seconds. A run that fails stops the others (they keep
    their last checkpoint) and raises :class:`RunFailed` with its error."""
    if jobs < 1 or threads < 1:
        raise ValueError(f"jobs and threads must be >= 1, got {jobs} and {threads}")
    ctx = multiprocessing.get_context("spawn")
    waiting = list(runs)
    active: dict[str, tuple[Run, multiprocessing.process.BaseProcess, float]] = {}
    seconds: dict[str, float] = {}
    total = sum(r.cfg.train.steps for r in runs)
    bar = tqdm(total=total, disable=not progress, unit="step", dynamic_ncols=True,
               desc=f"training {jobs} at a time")
    try:
        while waiting or active:
            while waiting and len(active) < jobs:
                run = waiting.pop(0)
                run.out_dir.parent.mkdir(parents=True, exist_ok=True)
                cfg = dataclasses.replace(run.cfg, train=dataclasses.replace(
                    run.cfg.train, threads=threads))
                proc = ctx.Process(target=_train_in_child, args=(dataclasses.replace(
                    run, cfg=cfg),), name=f"attnlab-train-{run.name}", daemon=True)
                proc.start()
                active[run.name] = (run, proc, time.perf_counter())
                logger.info("%s: training in process %d (%d thread%s, log %s)", run.name,
                            proc.pid, threads, "s" if threads > 1 else "", run.log_path)
            time.sleep(POLL_S)
            for name, (run, proc, start) in list(active.items()):
                if proc.is_alive():
                    continue
                proc.join()
                del active[name]
                if proc.exitcode != 0:
                    raise RunFailed(f"training {name} failed (exit code {proc.exitcode}): "
                                    f"{_last_line(run.log_path)} (log: {run.log_path})")
                seconds[name] = time.perf_counter() - start
                if on_done is not None:
                    on_done(run, seconds[name])
            records = {name: run.progress() for name, (run, _, _) in active.items()}
            bar.n = (sum(r.cfg.train.steps for r in runs if r.name in seconds)
                     + sum(record.get("step", 0) for record in records.values()))
            bar.set_postfix_str(" | ".join(
                f"{name} {record.get('step', 0)}/{active[name][0].cfg.train.steps}"
                + (f" loss {record['loss']:.3f}" if "loss" in record else "")
                for name, record in records.items()), refresh=False)
            bar.refresh()
    finally:
        for _, proc, _ in active.values():  # stopped or failed: the others stop too
            if proc.is_alive():
                proc.terminate()
            proc.join()
        bar.close()
    return seconds
