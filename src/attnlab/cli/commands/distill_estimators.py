"""``attnlab distill-estimators``: distil sea_pages' page estimators of a Hugging Face
model, frozen and layer by layer."""

from __future__ import annotations

import argparse
import json

from attnlab.cli import options
from attnlab.cli.command import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab distill-estimators``."""
    options.add_model(parser, required=True)
    parser.add_argument("--config", default=None, metavar="YAML",
                        help="recipe file or built-in name, e.g. smollm2/estimators (default: "
                             "the recipe's defaults)")
    options.add_set(parser, help="override a recipe value, e.g. --set steps=50 (repeatable)")
    parser.add_argument("--out", required=True, help="the folder to write")
    options.add_quiet(parser)
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Distil the estimators into ``--out`` and print how much attention they keep."""
    from attnlab.distill.estimators import distill_estimators, load_recipe

    recipe = load_recipe(args.config, args.set)
    summary = distill_estimators(args.model, recipe, args.out, gguf_file=args.gguf_file,
                                 force=args.force, progress=not args.quiet)
    held = [row["held_out"] for row in summary["layers"]]
    print(json.dumps({
        "out": args.out, "minutes": round(summary["minutes"], 2),
        "backbone_unchanged": summary["backbone_unchanged"],
        "mean_held_out_kept_mass": {key: round(sum(h[key] for h in held) / len(held), 4)
                                    for key in ("kept_mass_block", "kept_mass_after",
                                                "kept_mass_best")}}, indent=2))
    return 0


COMMAND = Command(
    "distill-estimators",
    "distil sea_pages' page estimators of a Hugging Face model, frozen and layer by layer",
    add_arguments, run,
    description="Each layer's page estimator learns the frozen model's own attention over "
                "pages (no backward pass through the model); writes OUT/estimators."
                "safetensors for '{name: sea_pages, estimators: OUT/estimators."
                "safetensors}', with curves.json, loss.png and recipe.yaml.")
