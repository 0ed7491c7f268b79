"""The ``attnlab`` command line: train, distill, eval, long-context, generate, macs, match,
bench, export, visualize, report, demo."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from attnlab.cli.args import MIN_REPS
from attnlab.cli.parser import build_parser
from attnlab.cli.plugins import import_plugins
from attnlab.config import ConfigError

__all__ = ["MIN_REPS", "build_parser", "main"]


INPUT_OPTIONS = ("config", "configs", "run", "model", "text_file", "teacher", "paths", "runs")
FOLDER_COMMANDS = ("report", "demo", "visualize", "export")  # whose --out is a folder


def command_inputs(args: argparse.Namespace) -> list[str]:
    """The files and folders a command reads, as given (the write policy never replaces
    them)."""
    given: list[str] = []
    for name in INPUT_OPTIONS:
        value = getattr(args, name, None)
        given += [v for v in (value if isinstance(value, list) else [value])
                  if isinstance(v, str) and os.path.exists(v)]
    return given


def _check_before_work(args: argparse.Namespace) -> None:
    """``ConfigError`` for a device this machine lacks, ``OutputRefused`` for an output the
    write policy (:mod:`attnlab.utils.outputs`) refuses and ``ConfigError`` for one that
    cannot be written, before any work starts (train and distill check their ``--out``
    themselves, the folder commands their folder)."""
    from attnlab.utils.device import resolve_device
    from attnlab.utils.io import unwritable_reason
    from attnlab.utils.outputs import check_output_file

    if getattr(args, "device", None) not in (None, "auto"):
        resolve_device(args.device)
    outputs = {"--json": (getattr(args, "json", None), False, "json"),
               "--plot": (getattr(args, "plot", None), False, "png")}
    if args.command in FOLDER_COMMANDS:
        outputs["--out"] = (args.out, True, None)
    elif args.command == "match":
        outputs["--out"] = (args.out, False, "yaml")
    inputs = command_inputs(args)
    given = {option: os.path.realpath(path) for option, (path, _, _) in outputs.items()
             if isinstance(path, str)}
    if len(set(given.values())) < len(given):
        raise ConfigError(f"{' and '.join(given)} name the same file; give each its own")
    for option, (path, folder, kind) in outputs.items():
        if not isinstance(path, str):
            continue
        if reason := unwritable_reason(path, folder=folder):
            raise ConfigError(f"{option} {path}: cannot write there: {reason}")
        if kind is not None:
            check_output_file(path, kind, option=option, force=getattr(args, "force", False),
                              inputs=inputs)


def _user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that report a user's mistake (or a stop the user can act on): one
    ``error:`` line, exit status 2. Anything else is a bug and keeps its traceback."""
    from attnlab.train import CheckpointError, RankFailure, RunDirError, TrainingDiverged

    return (ValueError, OSError, ImportError, RunDirError, CheckpointError, TrainingDiverged,
            RankFailure)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``attnlab`` with ``argv`` (default: the command line) and return the exit status:
    the command's own, or on a stop 2 for a user's mistake (one ``error:`` line), 1 for a
    failed training process of the demo, 130 for Ctrl-C (a saved, resumable run: its own)."""
    args = build_parser().parse_args(argv)
    from attnlab.train.distributed import is_main_process

    level = logging.INFO if is_main_process() else logging.WARNING  # torchrun: rank 0 informs
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
    )
    if getattr(args, "bench", None) or args.command == "demo":  # benchmarks: on the tuned heap
        from attnlab.utils.allocator import tune_cpu_allocator

        tune_cpu_allocator()
    from attnlab.demo.parallel import RunFailed
    from attnlab.train import RunInterrupted

    try:
        import_plugins(args.plugin)
        _check_before_work(args)
        code = args.func(args)
    except RunInterrupted as err:  # Ctrl-C / SIGTERM in train or distill: saved, resumable
        again = (f"attnlab demo --out {args.out} with the same options (it resumes)"
                 if args.command == "demo" else
                 f"attnlab {args.command} --out {err.folder} --resume")
        code = _stop(args, f"{err}; continue with: {again}", err.exit_code)
    except KeyboardInterrupt:
        code = _stop(args, "interrupted", 130)
    except RunFailed as err:  # a training process of the demo: its error and log
        code = _stop(args, f"error: {err}", 1)
    except _user_errors() as err:
        code = _stop(args, f"error: {str(err).strip() or type(err).__name__}", 2)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_worker(code)
    return code


def _exit_worker(code: int) -> None:
    """End a torchrun worker now, its work done, output flushed and process group left.

    An ordinary interpreter exit runs C++ static destructors, and gloo's connection threads
    can still be joinable then: under load a rank aborted there ("terminate called without an
    active exception", exit -6) after a run that had finished and saved, and torchrun then
    reported the whole job as failed. Nothing is left to clean up that the OS does not.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stop(args: argparse.Namespace, message: str, code: int) -> int:
    """Print ``message`` (after the traceback with ``-v``) and return the exit status."""
    if args.verbose:
        traceback.print_exc()
    print(message, file=sys.stderr)
    return code
