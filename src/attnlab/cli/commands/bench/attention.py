"""``attnlab bench attention``: attention cores (q, k, v -> o) vs seq_len."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.args import csv_list, number
from attnlab.cli.command import Command
from attnlab.cli.commands.bench.records import print_records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab bench attention``."""
    parser.add_argument("--mechanisms", type=csv_list(str), default=None, metavar="A,B,...",
                        help="registered core names, or CORE@LABEL for another copy of a "
                             "core with its own --set options (default: those of sdpa,eager,"
                             "sea,performer,reformer that are registered); sdpa, the "
                             "baseline, is always run")
    options.add_seq_lens(parser, [1024, 2048, 4096, 8192, 16384])
    causal = parser.add_mutually_exclusive_group()
    causal.add_argument("--causal", dest="causal", action="store_true", default=True,
                        help="causal attention (default)")
    causal.add_argument("--bidirectional", dest="causal", action="store_false")
    parser.add_argument("--pass", dest="pass_", choices=["fwd", "fwdbwd"], default="fwd")
    options.add_attention_shape(parser, heads=12)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        default="float32")
    options.add_set(parser, metavar="MECH.OPTION=VALUE",
                    help="a core option, e.g. --set sea.k=32 (repeatable)")
    parser.add_argument("--max-mem-gb", type=number(float, above=0.0), default=None,
                        help="skip a mechanism whose estimated peak exceeds this many GiB "
                             "(default: 40%% of the device's memory)")
    options.add_reps(parser, 10)
    options.add_device(parser)
    options.add_json(parser)
    options.add_plot(parser, help="time and memory vs seq_len (needs matplotlib: attnlab[plot])")
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Time the cores, print the table and how each scales with seq_len."""
    import torch

    from attnlab.bench import attention
    from attnlab.results import scaling

    records = attention.run(
        mechanisms=args.mechanisms, seq_lens=args.seq_lens, causal=args.causal,
        pass_=args.pass_, heads=args.heads, d_head=args.d_head, batch=args.batch,
        dtype=getattr(torch, args.dtype), options=args.set, reps=args.reps,
        max_mem_gb=args.max_mem_gb, json_path=args.json, plot_path=args.plot,
        device=args.device,
    )
    print_records(records, args.json)
    print()
    print(scaling.format_summary(records))
    if args.plot:
        print(f"saved {args.plot}")
    return 0


COMMAND = Command("attention", "attention cores (q, k, v -> o) vs seq_len", add_arguments, run)
