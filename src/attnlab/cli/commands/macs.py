"""``attnlab macs``: attention MACs, activation memory and parameters of a config."""

from __future__ import annotations

import argparse
import json

from attnlab.cli import options
from attnlab.cli.args import resolve_config_path
from attnlab.cli.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab macs``."""
    parser.add_argument("--config", required=True, help="YAML file or built-in config name")
    options.add_set(parser)
    parser.add_argument("--convention", choices=["paper", "exact"], default="exact",
                        help="paper: the SwitchHead paper's formulas; exact: what attnlab "
                             "executes")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    """Print the config's attention costs, as a list or as JSON."""
    from attnlab.metrics import attention_cost
    from attnlab.train import load_run_config

    cost = attention_cost(load_run_config(resolve_config_path(args.config), args.set),
                          args.convention)
    if args.json:
        print(json.dumps(cost, indent=2))
    else:
        for key, value in cost.items():
            print(f"{key:>26}: {value:,}" if isinstance(value, int) else f"{key:>26}: {value}")
    return 0


COMMAND = Command("macs", "attention MACs, activation memory and parameters", add_arguments,
                  run)
