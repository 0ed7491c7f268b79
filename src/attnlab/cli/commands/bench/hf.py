"""``attnlab bench hf``: a Hugging Face model vs its attnlab-converted copy: forward latency
and cached generation."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.args import MIN_REPS, at_least, yaml_core
from attnlab.cli.command import Command
from attnlab.cli.commands.bench.records import print_records

CORES_HELP = ("converted core: a name or YAML with options, e.g. '{name: sea, k: 64, "
              "predictor_length: 64}' (repeatable; default: sea)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab bench hf``."""
    options.add_converted_model(parser, CORES_HELP)
    options.add_seq_lens(parser, [256, 512, 1024, 2048])
    options.add_batch(parser)
    parser.add_argument("--new-tokens", type=at_least(1), default=32,
                        help="tokens generated per prompt")
    options.add_reps(parser, MIN_REPS)
    options.add_device(parser)
    options.add_json(parser)
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Time the original and the converted models, print the table and the summary."""
    from attnlab.bench import hf  # ImportError without transformers: one line

    records = hf.run(
        args.model, gguf_file=args.gguf_file,
        cores=[yaml_core(c) for c in args.core] or ["sea"], seq_lens=args.seq_lens,
        batch=args.batch, new_tokens=args.new_tokens, reps=args.reps, json_path=args.json,
        device=args.device,
    )
    print_records(records, args.json)
    print()
    print(hf.format_summary(records))
    return 0


COMMAND = Command("hf", "a Hugging Face model vs its attnlab-converted copy: forward latency "
                        "and cached generation", add_arguments, run)
