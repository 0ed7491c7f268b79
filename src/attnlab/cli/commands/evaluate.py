"""``attnlab eval``: evaluate a trained run on held-out text."""

from __future__ import annotations

import argparse
import json

from attnlab.cli import options
from attnlab.cli.args import at_least
from attnlab.cli.command import Command
from attnlab.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab eval``."""
    options.add_trained_run(parser)
    options.add_set(
        parser, metavar="data.KEY=VALUE",
        help="change the data, e.g. --set data.corpus=wiki (tokenizer stays the run's)")
    parser.add_argument("--split", choices=["valid", "test"], default="test")
    parser.add_argument("--seq-len", type=at_least(1), default=None,
                        help="tokens per evaluated window (default: the run's train.seq_len)")
    parser.add_argument("--batch-size", type=at_least(1), default=8, help="windows per forward")
    parser.add_argument("--max-tokens", type=at_least(1), default=None,
                        help="evaluate only the first N tokens of the split (default: all)")
    parser.add_argument("--threads", type=at_least(1), default=None,
                        help="torch threads (default: torch's choice, like train.threads)")
    options.add_device(parser, help=options.DEVICE_HELP)
    options.add_quiet(parser)


def run(args: argparse.Namespace) -> int:
    """Print the run's loss (and its per-token and per-byte metrics) on ``--split``."""
    import torch

    from attnlab.config import apply_override, from_dict, to_dict
    from attnlab.data import DataConfig, load_corpus
    from attnlab.train.evaluate import evaluate_lm, loss_metrics
    from attnlab.train.run import load_run

    if args.threads:
        torch.set_num_threads(args.threads)
    trained = load_run(args.run, args.device)
    data = to_dict(trained.cfg.data)
    for assignment in args.set:
        assignment = assignment.removeprefix("data.")
        if assignment.split("=", 1)[0] in ("tokenizer", "vocab_size"):
            raise ConfigError(f"--set data.{assignment}: eval encodes text with the run's own "
                              "tokenizer, which cannot be changed")
        apply_override(data, assignment)
    seq_len = args.seq_len or trained.cfg.train.seq_len
    model_cfg = trained.cfg.model
    if seq_len + model_cfg.memory_len > model_cfg.max_seq_len:
        raise ConfigError(
            f"--seq-len {seq_len} + model.memory_len {model_cfg.memory_len} exceeds the "
            f"model's max_seq_len {model_cfg.max_seq_len}"
        )
    corpus = load_corpus(from_dict(DataConfig, data, "data"), tokenizer=trained.tokenizer)
    tokens = getattr(corpus, args.split)
    result = evaluate_lm(trained.model, tokens, batch_size=args.batch_size, seq_len=seq_len,
                         max_tokens=args.max_tokens, device=args.device,
                         progress=not args.quiet)
    bytes_per_token = corpus.bytes_per_token(args.split)
    report = {"run": str(args.run), "step": trained.step, "split": args.split, "seq_len": seq_len,
              "loss": result["loss"], "tokens": result["tokens"],
              **loss_metrics(result["loss"], corpus.unit, bytes_per_token)}
    print(json.dumps(report, indent=2))
    return 0


COMMAND = Command("eval", "evaluate a trained run on held-out text", add_arguments, run)
