"""``attnlab bench layer``: one attention layer: dense-h10/h2, switchhead, moa."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.command import Command
from attnlab.cli.commands.bench.records import print_records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab bench layer``."""
    options.add_preset(parser)
    options.add_batch(parser)
    options.add_passes(parser, ["fwdbwd"])
    options.add_reps(parser, 10)
    options.add_device(parser)
    options.add_json(parser)
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Time the layers and print the table."""
    from attnlab.bench import layer

    records = layer.run(preset=args.preset, batch=args.batch, passes=args.passes, reps=args.reps,
                        json_path=args.json, device=args.device)
    return print_records(records, args.json)


COMMAND = Command("layer", "one attention layer: dense-h10/h2, switchhead, moa", add_arguments,
                  run)
