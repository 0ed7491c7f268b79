"""``attnlab demo``: the main job: train, distil, benchmark and report, within a time
budget."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli import options
from attnlab.cli.args import at_least, number
from attnlab.cli.command import Command
from attnlab.demo.plan import BUDGET_MINUTES, PRECISIONS, REAL_MODEL_CHOICES, REAL_MODEL_MINUTES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab demo``."""
    parser.add_argument("--out", default="runs/demo", help="output folder (re-run to resume)")
    parser.add_argument("--budget-minutes", type=number(float, above=0.0),
                        default=BUDGET_MINUTES,
                        help="wall-clock budget of the stages (steps are scaled to fit)")
    parser.add_argument("--strict-budget", action="store_true",
                        help="never go over the budget: a stage it cuts below its minimum is "
                             "marked inconclusive (default: keep every stage at its minimum "
                             "and go over the budget, saying by how much)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="how the models train: auto = bf16 autocast where the device "
                             "computes bf16 natively, else fp32 (distillation and benchmark: "
                             "fp32)")
    parser.add_argument("--train-jobs", type=at_least(1), default=None, metavar="N",
                        help="models trained at once, each in its own process (default: on a "
                             "CPU one per thread, one thread each; on a GPU 1)")
    parser.add_argument("--real-model", choices=REAL_MODEL_CHOICES, default="auto",
                        help="the real-model stage: SEA's page selection (sea_pages, the "
                             "shipped SmolLM2-135M estimators) against the original, Quest and "
                             "a sliding window at one key budget, quality and serving speed at "
                             "long context (~17 min on 2 cores); auto = on from "
                             f"--budget-minutes {REAL_MODEL_MINUTES:.0f}")
    parser.add_argument("--smoke", action="store_true",
                        help="toy sizes, every stage in seconds (for tests)")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda")
    options.add_quiet(parser, help="no progress bars")
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Run (or resume) the demo in ``--out`` and print its compact table."""
    from attnlab.demo import run_demo
    from attnlab.report import compact_table

    results = run_demo(Path(args.out), budget_minutes=args.budget_minutes,
                       scale="smoke" if args.smoke else "full", device=args.device,
                       progress=not args.quiet, strict_budget=args.strict_budget,
                       precision=args.precision, train_jobs=args.train_jobs,
                       real_model=args.real_model, force=args.force)
    print(compact_table(results))
    print(f"report: {Path(args.out) / 'report.md'}")
    return 0


COMMAND = Command("demo", "the main job: train, distil, benchmark and report, within a time "
                          "budget", add_arguments, run)
