"""``attnlab bench expert-matmul``: expert matmul vs naive vs dense-equal-MACs."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.args import MIN_REPS, at_least
from attnlab.cli.command import Command
from attnlab.cli.commands.bench.records import print_records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab bench expert-matmul``."""
    parser.add_argument("--tokens", type=at_least(1), default=4096, help="tokens per call")
    options.add_preset(parser)
    options.add_passes(parser, ["fwd", "fwdbwd"])
    options.add_reps(parser, 10)
    parser.add_argument("--naive-reps", type=at_least(MIN_REPS), default=MIN_REPS,
                        help=f"timed repetitions of the slow reference (>= {MIN_REPS})")
    # attnlab.bench.expert_matmul.FORCEABLE, spelled out: that module imports torch
    parser.add_argument("--backends", nargs="+", choices=["grouped", "dense", "triton"],
                        default=[], help="also time these backends forced (auto's choice is "
                                         "'fast')")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    options.add_device(parser)
    options.add_json(parser)
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Time the expert matmuls and print the table."""
    import torch

    from attnlab.bench import expert_matmul

    records = expert_matmul.run(
        tokens=args.tokens, preset=args.preset, passes=args.passes, reps=args.reps,
        naive_reps=args.naive_reps, json_path=args.json, dtype=getattr(torch, args.dtype),
        device=args.device, backends=args.backends,
    )
    return print_records(records, args.json)


COMMAND = Command("expert-matmul", "expert matmul vs naive vs dense-equal-MACs", add_arguments,
                  run)
