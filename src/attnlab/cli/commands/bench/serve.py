"""``attnlab bench serve``: prefill latency and decode tokens/s of a Hugging Face model vs
its attnlab-converted copies, with in-place KV caches."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.cli import options
from attnlab.cli.args import at_least, csv_list, yaml_core
from attnlab.cli.command import Command
from attnlab.config import ConfigError

if TYPE_CHECKING:
    from attnlab.bench.serve_reference import LlamaCpp

CORES_HELP = ("converted core: a name or YAML with options (repeatable; default: "
              "'{name: sea, k: 256, predictor_length: 64}')")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab bench serve``."""
    options.add_converted_model(parser, CORES_HELP)
    options.add_seq_lens(parser, [2048, 4096, 8192],
                         help="context lengths (decode: keys the last timed step attends to; "
                              "at most the model's max_position_embeddings)")
    parser.add_argument("--batches", type=csv_list(int, 1), default=[1, 4, 8],
                        metavar="B1,B2,...",
                        help="decode batch sizes (rows beyond the first are left-padded)")
    parser.add_argument("--prefill-batches", type=csv_list(int, 1), default=[1],
                        metavar="B1,B2,...", help="prefill batch sizes; '' (empty) for no "
                                                  "prefill")
    parser.add_argument("--dtypes", type=csv_list(str), default=["float32"],
                        metavar="D1,D2,...", help="float32, bfloat16 (float16 on cuda only)")
    parser.add_argument("--steps", type=at_least(1), default=8,
                        help="timed decode steps per model in each round")
    parser.add_argument("--warmup", type=at_least(1), default=2,
                        help="untimed decode steps first (the first builds the cores' state)")
    parser.add_argument("--reps", type=at_least(1), default=3,
                        help="rounds of alternation (prefill: timed prefills per model)")
    parser.add_argument("--threads", type=at_least(1), default=None,
                        help="torch threads during the run, at most the machine's cores "
                             "(default: unchanged)")
    parser.add_argument("--weights", choices=["float", "int8"], default="float",
                        help="every model's own linear layers (not a core's parts): in the "
                             "dtype (float) or weight-only int8, activations in the dtype "
                             "(default: float)")
    parser.add_argument("--llama-cpp", action="store_true",
                        help="add llama.cpp's dense decoding of the same GGUF file as a row "
                             "(batch 1, cpu; needs --gguf-file and attnlab[llama-cpp], else "
                             "skipped with a note)")
    options.add_device(parser, help=options.DEVICE_HELP)
    options.add_json(parser, help="save records and the summary as JSON")
    options.add_plot(parser, help="decode tokens/s vs context length (needs matplotlib: "
                                  "attnlab[plot])")
    options.add_force(parser)


def llama_cpp_reference(model: str | None, gguf_file: str | None) -> LlamaCpp:
    """The llama.cpp row of ``--llama-cpp``: ``ConfigError`` unless the model is a GGUF file."""
    from attnlab.bench.serve_reference import LlamaCpp

    if model is None or gguf_file is None:
        raise ConfigError("--llama-cpp runs llama.cpp on the model's GGUF file: give --model "
                          "FOLDER and --gguf-file NAME")
    return LlamaCpp(Path(model) / gguf_file)


def run(args: argparse.Namespace) -> int:
    """Time prefill and decoding of each model and print the summary."""
    from attnlab.bench import serve  # ImportError without transformers
    from attnlab.results import serve as serve_report

    cores = [yaml_core(c) for c in args.core] or list(serve.DEFAULT_CORES)
    references = [llama_cpp_reference(args.model, args.gguf_file)] if args.llama_cpp else []
    records = serve.run(
        args.model, gguf_file=args.gguf_file, cores=cores, seq_lens=args.seq_lens,
        batches=args.batches, prefill_batches=args.prefill_batches, dtypes=args.dtypes,
        steps=args.steps, warmup=args.warmup, reps=args.reps, threads=args.threads,
        device=args.device, json_path=args.json, plot_path=args.plot, references=references,
        weights=args.weights,
    )
    print(serve_report.format_summary(records))
    for name, why in dict.fromkeys((r.name, r.skipped) for r in records if r.skipped):
        print(f"{name} skipped: {why}")
    for path in (args.json, args.plot):
        if path:
            print(f"saved {path}")
    return 0


COMMAND = Command(
    "serve", "serving: prefill latency and decode tokens/s of a Hugging Face model vs its "
             "attnlab-converted copies, with in-place KV caches",
    add_arguments, run,
    description="Prefill (real left-padded prompts) and cached decoding (from random caches of "
                "each context length) of the original model and each converted core, side by "
                "side. A CPU prefill of the original is quadratic in T: at T=8192 and batch 8 "
                "it takes minutes on SmolLM2-135M, hence --prefill-batches 1 by default.")
