"""``attnlab train``: train a language model from a YAML config."""

from __future__ import annotations

import argparse
import json

from attnlab.cli import options
from attnlab.cli.args import resolve_config_path
from attnlab.cli.command import Command
from attnlab.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab train``."""
    parser.add_argument("--config", help="YAML file, or a built-in name such as 'tiny'")
    options.add_set(parser, help="override a config value, e.g. --set train.lr=3e-4 (repeatable)")
    options.add_run_folder(parser, "run folder to create (or resume)")


def run(args: argparse.Namespace) -> int:
    """Train (or resume) the run in ``--out`` and print its summary."""
    from attnlab.train import load_run_config, train
    from attnlab.train.distributed import is_main_process
    from attnlab.train.runner import RunFolder

    folder = RunFolder(args.out, "config.yaml", "run", resume=args.resume, force=args.force)
    folder.check()  # before reading anything: "no run there" rather than "no config.yaml"
    if args.config is None and not args.resume:
        raise ConfigError("attnlab train needs --config FILE (or --resume)")
    source = args.config or str(folder.config_path)
    cfg = load_run_config(resolve_config_path(source), args.set)
    summary = train(cfg, folder.path, resume=args.resume, progress=not args.quiet,
                    force=args.force)
    if is_main_process():  # under torchrun every rank returns the summary; one prints it
        print(json.dumps(summary, indent=2))
    return 0


COMMAND = Command("train", "train a language model from a YAML config", add_arguments, run)
