"""``attnlab generate``: sample text from a trained run."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.args import at_least, number
from attnlab.cli.command import Command
from attnlab.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab generate``."""
    options.add_trained_run(parser)
    parser.add_argument("--prompt", required=True, help="text the sample continues")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=200,
                        help="tokens to generate (with the KV cache)")
    parser.add_argument("--temperature", type=number(float, 0.0), default=0.8,
                        help="softmax temperature, >= 0 (lower: likelier tokens; 0: greedy)")
    parser.add_argument("--top-k", type=at_least(1), default=None,
                        help="sample among the k most likely tokens only (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the sampling")
    options.add_device(parser, help=options.DEVICE_HELP)


def run(args: argparse.Namespace) -> int:
    """Print the prompt and its sampled continuation."""
    import torch

    from attnlab.train.run import load_run

    trained = load_run(args.run, args.device)
    ids = trained.tokenizer.encode(args.prompt)
    if not ids:
        raise ConfigError("--prompt encodes to no tokens")
    generator = torch.Generator(args.device).manual_seed(args.seed)
    out = trained.model.generate(
        torch.tensor([ids], device=args.device), args.max_new_tokens,
        temperature=args.temperature, top_k=args.top_k, generator=generator,
    )
    print(trained.tokenizer.decode(out[0].tolist()))
    return 0


COMMAND = Command("generate", "sample text from a trained run", add_arguments, run)
