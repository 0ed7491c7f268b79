"""``attnlab match``: a SwitchHead or MoA config with the parameters of a dense one."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.args import at_least, resolve_config_path
from attnlab.cli.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab match``."""
    parser.add_argument("--config", required=True,
                        help="the dense baseline: YAML file or built-in config name")
    options.add_set(parser, help="override a value of the dense config (repeatable)")
    parser.add_argument("--projections", choices=["switchhead", "moa"], default="switchhead")
    parser.add_argument("--heads", type=at_least(1), required=True, help="attention heads H")
    parser.add_argument("--experts", type=at_least(1), required=True,
                        help="experts E (switchhead: per head; moa: in all)")
    parser.add_argument("--k", type=at_least(1), default=None,
                        help="switchhead: experts chosen per head and token (default 2); moa: "
                             "none")
    parser.add_argument("--solve", choices=["both", "d_head", "d_ff"], default="both",
                        help="both (default, the paper's recipe): the largest d_head within "
                             "the dense parameters, then d_ff nudged; d_head: d_head alone; "
                             "d_ff: d_ff alone")
    parser.add_argument("--d-head", type=at_least(1), default=None,
                        help="with --solve d_ff: the d_head to keep (default: the dense one)")
    parser.add_argument("--d-head-multiple", type=at_least(1), default=None,
                        help="a solved d_head is a multiple of this (default: 4 with --solve "
                             "both, as the paper's, else 1)")
    parser.add_argument("--out", default=None, metavar="NEW.yaml",
                        help="write the matched config")
    options.add_json(parser, help="save the report as JSON")
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Print dense vs matched, and write the matched config and the report where asked."""
    from attnlab.config import dump_yaml
    from attnlab.metrics import format_match, match_header, match_params
    from attnlab.train import load_run_config
    from attnlab.utils.io import atomic_write_json, atomic_write_text

    source = resolve_config_path(args.config)
    matched, report = match_params(
        load_run_config(source, args.set), args.projections, n_heads=args.heads,
        n_experts=args.experts, k=args.k, solve=args.solve, d_head=args.d_head,
        d_head_multiple=args.d_head_multiple,
    )
    print(format_match(report))
    if args.out:
        atomic_write_text(args.out, match_header(report, args.config) + dump_yaml(matched))
        print(f"saved {args.out}")
    if args.json:
        atomic_write_json(args.json, {"written_by": "attnlab match", **report.to_dict(),
                                      "config": str(source), "out": args.out})
        print(f"saved {args.json}")
    return 0


COMMAND = Command(
    "match", "a SwitchHead or MoA config with the parameters of a dense one", add_arguments, run,
    description="Solve d_head and/or d_ff so that a SwitchHead (or MoA) model has the "
                "parameter count of a dense baseline (the SwitchHead paper's recipe), print "
                "dense vs matched and write the config. The authors' head-count rule: start "
                "at 2 heads, double to 4 if worse than the dense baseline.")
