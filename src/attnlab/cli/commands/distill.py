"""``attnlab distill``: distil a teacher into an efficient-attention student."""

from __future__ import annotations

import argparse
import json

from attnlab.cli import options
from attnlab.cli.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab distill``."""
    parser.add_argument(
        "--teacher", default=None, metavar="SPEC",
        help="attnlab run folder (a model trained with attnlab train), Hugging Face model "
             "folder, or model name in the local Hugging Face cache")
    parser.add_argument("--gguf-file", default=None, metavar="NAME",
                        help="load this GGUF file of the --teacher folder (dequantised)")
    parser.add_argument(
        "--student-attention", default=None, metavar="CORE",
        help="student attention core: a name (sea, performer, reformer) or YAML with options, "
             "e.g. '{name: sea, k: 16, predictor_length: 32}'")
    parser.add_argument(
        "--recipe", default=None, metavar="NAME",
        help="whose defaults fill unset keys: attnlab (default) or sea-paper (SEA's public "
             "code: lr 1e-5, pretrained weights at 1x, its baselines' settings)")
    parser.add_argument("--config", default=None, help="YAML with distill: and data: sections")
    options.add_set(parser, help="override, e.g. steps=200 (= distill.steps) or data.corpus=wiki")
    options.add_run_folder(parser, "the student's run folder")


def run(args: argparse.Namespace) -> int:
    """Distil (or resume) the student in ``--out`` and print its summary."""
    from attnlab.distill import distill, load_distill_config
    from attnlab.train.runner import RunFolder

    folder = RunFolder(args.out, "distill.yaml", "distillation", resume=args.resume,
                       force=args.force)
    folder.check()
    overrides = [a if a.startswith(("distill.", "data.")) else f"distill.{a}" for a in args.set]
    if args.teacher is not None:
        overrides.insert(0, f"distill.teacher={json.dumps(args.teacher)}")
    if args.gguf_file is not None:
        overrides.insert(0, f"distill.gguf_file={json.dumps(args.gguf_file)}")
    if args.student_attention is not None:
        overrides.insert(0, f"distill.student_attention={args.student_attention}")
    if args.recipe is not None:
        overrides.insert(0, f"distill.recipe={json.dumps(args.recipe)}")
    source = args.config or (folder.config_path if args.resume else None)
    cfg = load_distill_config(source, overrides)
    summary = distill(cfg, folder.path, resume=args.resume, progress=not args.quiet,
                      force=args.force)
    print(json.dumps(summary, indent=2))
    return 0


COMMAND = Command("distill", "distil a teacher into an efficient-attention student",
                  add_arguments, run)
