"""``attnlab long-context``: perplexity and passkey retrieval at long contexts of a Hugging
Face model and its variants."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.args import at_least, csv_list
from attnlab.cli.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab long-context``."""
    options.add_model(parser, required=True)
    parser.add_argument(
        "--variant", action="append", default=[], metavar="YAML",
        help="'original', a core with options ('{name: window, sinks: 4, window: 252}', "
             "'{name: quest, budget: 256}', '{name: oracle, k: 256}', '{name: sea_pages, "
             "budget: 256, estimators: smollm2-135m}') or a distilled student ('{name: sea, "
             "student: OUT/student, k: 256}'); repeatable (default: original)")
    parser.add_argument("--tasks", type=csv_list(str), default=["perplexity", "passkey"],
                        metavar="T1,T2", help="perplexity, passkey")
    parser.add_argument("--lengths", type=csv_list(int, 2), default=[2048, 4096, 8192],
                        metavar="T1,T2,...")
    parser.add_argument("--corpus", default="shakespeare",
                        choices=["shakespeare", "wiki", "pystdlib"],
                        help="built-in corpus of the perplexity documents")
    parser.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    parser.add_argument("--stride", type=float, default=0.5,
                        help="sliding-window stride as a fraction of the length")
    parser.add_argument("--ppl-tokens", type=at_least(1), default=16384,
                        help="perplexity targets per length")
    parser.add_argument("--ppl-document-tokens", type=at_least(1), default=None,
                        help="at most this many of them from one document, so that the "
                             "sample spans several (default: no cap, documents in order)")
    parser.add_argument("--depths", type=csv_list(float), default=[0.1, 0.5, 0.9],
                        metavar="D1,D2,...",
                        help="passkey depths (fractions of the filler before the key)")
    parser.add_argument("--prompts", type=at_least(1), default=20,
                        help="passkey prompts per length x depth")
    parser.add_argument("--passkey-protocols", type=csv_list(str), default=["sparse"],
                        metavar="P1,P2",
                        help="sparse (the variant reads the whole prompt) and/or dense-prefill "
                             "(the original prefills up to the question; each variant decodes "
                             "the rest)")
    parser.add_argument("--seed", type=int, default=0, help="passkey keys")
    options.add_device(parser)
    options.add_json(parser, help="save the records as JSON")
    options.add_quiet(parser)
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Measure the model and each variant and print the table."""
    from attnlab.evals import long_context  # ImportError without transformers: one line

    cfg = long_context.LongContextConfig(
        lengths=tuple(args.lengths), tasks=tuple(args.tasks), corpus=args.corpus,
        split=args.split, stride=args.stride, ppl_tokens=args.ppl_tokens,
        ppl_document_tokens=args.ppl_document_tokens,
        depths=tuple(args.depths), prompts=args.prompts,
        passkey_protocols=tuple(args.passkey_protocols), seed=args.seed)
    result = long_context.run(args.model, args.variant, cfg, gguf_file=args.gguf_file,
                              device=args.device, json_path=args.json, progress=not args.quiet)
    print(long_context.format_table(result))
    if args.json:
        print(f"saved {args.json}")
    return 0


COMMAND = Command(
    "long-context", "perplexity and passkey retrieval at long contexts of a Hugging Face model "
                    "and its variants (window, oracle, SEA students)",
    add_arguments, run,
    description="Sliding-window perplexity on whole held-out documents and passkey retrieval "
                "(greedy) at each length, for the original model and each --variant, side by "
                "side on the same tokens and prompts.")
