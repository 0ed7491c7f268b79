"""The argument parser of ``attnlab``: the global options, then every subcommand (each adds
its own options: :mod:`attnlab.cli.commands`)."""

from __future__ import annotations

import argparse

from attnlab import __version__
from attnlab.cli.command import register_all
from attnlab.cli.commands import COMMANDS

DESCRIPTION = (
    "Train, distil, evaluate, benchmark and report efficient attention: train, distill, eval, "
    "long-context, generate, macs, match, bench, export, visualize, report, demo."
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``attnlab``: each subcommand stores its handler as ``func``."""
    parser = argparse.ArgumentParser(prog="attnlab", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import this Python module (a name, or a .py file's path) "
                             "first, e.g. one that registers your own attention parts "
                             "(repeatable)")
    register_all(parser.add_subparsers(dest="command", required=True), COMMANDS)
    return parser
