"""``attnlab bench bias``: a position bias (alibi, xl) through sdpa, eager and flex vs no
bias."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.args import MIN_REPS, csv_list
from attnlab.cli.command import Command
from attnlab.cli.commands.bench.records import print_records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab bench bias``."""
    parser.add_argument("--positions", type=csv_list(str), default=["alibi", "xl"],
                        metavar="A,B", help="position schemes with a score bias")
    options.add_seq_lens(parser, [1024, 2048, 4096, 8192])
    options.add_attention_shape(parser, heads=8)
    options.add_reps(parser, MIN_REPS)
    options.add_json(parser)
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Time the biased forwards and print the table."""
    from attnlab.bench import bias

    records = bias.run(positions=args.positions, seq_lens=args.seq_lens, heads=args.heads,
                       d_head=args.d_head, batch=args.batch, reps=args.reps,
                       json_path=args.json)
    return print_records(records, args.json)


COMMAND = Command(
    "bias", "a position bias (alibi, xl) through sdpa, eager and flex vs no bias",
    add_arguments, run,
    description="Causal attention forwards with a position scheme's score bias: SDPA without "
                "a bias (the baseline), SDPA with the bias materialised, the eager reference "
                "and the flex core (bias as a compiled score_mod).")
