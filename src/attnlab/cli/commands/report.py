"""``attnlab report``: the report of runs and benchmarks: Markdown, PNG, JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli import options
from attnlab.cli.command import Command
from attnlab.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab report``."""
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="run folders (attnlab train / distill), bench JSON files, or "
                             "folders holding them (e.g. a demo's output)")
    parser.add_argument("--runs", nargs="+", default=None, metavar="DIR",
                        help="more run folders (same as giving them as PATHs)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="writes DIR/report.md, DIR/*.png (with matplotlib), "
                             "DIR/results.json")
    parser.add_argument("--title", default="attnlab report")
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Write the report into ``--out`` and print its compact table."""
    from attnlab.report import build_report, collect, compact_table
    from attnlab.utils.outputs import OutputFolder

    paths = [*args.paths, *(args.runs or [])]
    if not paths:
        raise ConfigError("attnlab report needs run folders, bench JSON files or a demo "
                          "folder")
    out = OutputFolder.of(args.out, "report", force=args.force, inputs=paths)
    out.check()
    inputs = collect(paths)
    results = build_report(inputs, out.claim(), title=args.title)
    print(compact_table(results))
    print(f"saved {Path(args.out) / 'report.md'}")
    return 0


COMMAND = Command("report", "the report of runs and benchmarks: Markdown, PNG, JSON",
                  add_arguments, run)
