"""``attnlab bench train``: whole training steps of several configs."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.args import MIN_REPS, at_least, resolve_config_path
from attnlab.cli.command import Command
from attnlab.cli.commands.bench.records import print_records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab bench train``."""
    parser.add_argument("--configs", nargs="+", required=True,
                        help="YAML files or built-in names; the first is the baseline")
    parser.add_argument("--steps", type=at_least(MIN_REPS), default=MIN_REPS,
                        help=f"timed steps per config (>= {MIN_REPS})")
    options.add_set(parser, help="override applied to every config")
    options.add_device(parser)
    options.add_json(parser)
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Time the configs' training steps and print the table."""
    from attnlab.bench import train_step

    configs = [resolve_config_path(c) for c in args.configs]
    records = train_step.run(configs, steps=args.steps, overrides=args.set,
                             json_path=args.json, device=args.device)
    return print_records(records, args.json)


COMMAND = Command("train", "whole training steps of several configs", add_arguments, run)
