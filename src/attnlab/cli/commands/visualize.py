"""``attnlab visualize``: what a model's SEA or SwitchHead attention does on a text (PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli import options
from attnlab.cli.args import at_least, layer_or_all
from attnlab.cli.command import Command
from attnlab.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``attnlab visualize``."""
    parser.add_argument("model", metavar="PATH",
                        help="an attnlab run folder (train or distill), a distillation folder "
                             "of a Hugging Face teacher, or a Hugging Face student folder")
    text = parser.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", default=None, help="the text to run the model on")
    text.add_argument("--text-file", default=None, metavar="FILE",
                      help="read the text from FILE")
    parser.add_argument("--layer", type=layer_or_all, default=0, metavar="N|all",
                        help="layer to draw (negative: from the end) or all, tiled (default 0)")
    parser.add_argument("--head", type=layer_or_all, default=None, metavar="N|all",
                        help="head to draw or all, tiled (default all)")
    parser.add_argument("--teacher", default=None, metavar="PATH",
                        help="the teacher to compare SEA with (default: the one the "
                             "distillation recorded; none known: the model's own exact "
                             "attention)")
    parser.add_argument("--max-tokens", type=at_least(1), default=96,
                        help="tokens of the text to use (at most 1024; token labels up to 40)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder")
    options.add_device(parser)
    options.add_force(parser)


def run(args: argparse.Namespace) -> int:
    """Draw the pictures into ``--out`` and print what SEA attended to."""
    from attnlab.visualize import visualize

    text = args.text
    if args.text_file is not None:
        from attnlab.utils.readers import read_text

        text = read_text(args.text_file, "UTF-8 text (--text-file)")
    if not text.strip():
        raise ConfigError("the text is empty: give --text or a --text-file with text")
    summary = visualize(args.model, text, args.out, layer=args.layer, head=args.head,
                        teacher=args.teacher, max_tokens=args.max_tokens, device=args.device,
                        force=args.force)
    for part in ("sea", "switchhead"):
        if part in summary:
            print(f"saved {Path(args.out) / summary[part]['png']}")
    for row in summary.get("sea", {}).get("heads", []):
        print(f"layer {row['layer']} head {row['head']}: attended "
              f"{row['attended_fraction']:.1%} of cells, holding "
              f"{row['reference_weight_attended']:.1%} of the {summary['sea']['reference']}")
    return 0


COMMAND = Command(
    "visualize", "what a model's SEA or SwitchHead attention does on a text (PNG)",
    add_arguments, run,
    description="SEA layers: the teacher's attention, the Performer's implicit attention, "
                "the CNN's compressed estimate and the attended keys side by side (SEA's "
                "Fig. 3); SwitchHead layers: each token's value and output experts per head "
                "and the experts' load. Writes OUT/sea-attention.png, "
                "OUT/switchhead-experts.png and OUT/visualize.json.")
