"""``attnlab export``: a finished run as a Hugging Face folder (AutoModelForCausalLM)."""

from __future__ import annotations

import argparse

from attnlab.cli import options
from attnlab.cli.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab export``."""
    parser.add_argument("--run", required=True, metavar="DIR",
                        help="a finished attnlab train (or distill) run folder")
    parser.add_argument("--out", required=True, metavar="HF_DIR", help="the folder to write")
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Write the Hugging Face folder and print where."""
    from attnlab.hf import export_run

    print(f"saved {export_run(args.run, args.out, force=args.force)}")
    return 0


COMMAND = Command(
    "export", "a finished run as a Hugging Face folder (AutoModelForCausalLM)", add_arguments,
    run,
    description="Write the run's newest checkpoint, tokenizer and a generation config as a "
                "Hugging Face folder (model_type attnlab, safetensors). Load it with "
                "AutoModelForCausalLM.from_pretrained(OUT) after `import attnlab.hf`.")
