"""The subcommands of ``attnlab``, one module each: its options and its handler.

The order of ``COMMANDS`` is the order ``attnlab --help`` lists them in."""

from __future__ import annotations

from attnlab.cli.command import Command, CommandGroup
from attnlab.cli.commands import (
    demo,
    distill,
    distill_estimators,
    evaluate,
    export,
    generate,
    long_context,
    macs,
    match,
    report,
    train,
    visualize,
)
from attnlab.cli.commands.bench import GROUP as BENCH

COMMANDS: tuple[Command | CommandGroup, ...] = (
    train.COMMAND, distill.COMMAND, distill_estimators.COMMAND, evaluate.COMMAND,
    generate.COMMAND, macs.COMMAND, match.COMMAND, BENCH, long_context.COMMAND,
    export.COMMAND, visualize.COMMAND, report.COMMAND, demo.COMMAND,
)
