"""Options that several ``attnlab`` commands share, each defined once here: the commands'
modules call these in the order their ``--help`` lists the options."""

from __future__ import annotations

import argparse

from attnlab.cli.args import MIN_REPS, at_least, csv_list

DEVICE_HELP = "cpu, cuda or cuda:N"
RECORDS_JSON_HELP = "save records as JSON"


def add_model(parser: argparse.ArgumentParser, required: bool) -> None:
    """``--model FOLDER`` (optional: a small random Llama) and ``--gguf-file NAME``."""
    parser.add_argument("--model", required=required, default=None, metavar="FOLDER",
                        help="Hugging Face model folder"
                             + ("" if required else " (default: a small random Llama)"))
    parser.add_argument("--gguf-file", default=None, metavar="NAME",
                        help="a GGUF file in --model to load, e.g. "
                             "SmolLM2-135M-Instruct.Q4_1.gguf")


def add_trained_run(parser: argparse.ArgumentParser) -> None:
    """``--run``: the run folder of ``attnlab train`` that the command reads."""
    parser.add_argument("--run", required=True, help="run folder written by attnlab train")


def add_set(parser: argparse.ArgumentParser, help: str | None = None,
            metavar: str = "KEY=VALUE") -> None:
    """``--set``: repeatable overrides, collected in a list."""
    parser.add_argument("--set", action="append", default=[], metavar=metavar, help=help)


def add_quiet(parser: argparse.ArgumentParser, help: str = "no progress bar") -> None:
    """``--quiet``: no progress bar."""
    parser.add_argument("--quiet", action="store_true", help=help)


def add_force(parser: argparse.ArgumentParser) -> None:
    """``--force`` of every command that writes (the write policy: attnlab.utils.outputs)."""
    parser.add_argument("--force", action="store_true",
                        help="write even where the output holds files attnlab did not write "
                             "there (only this command's own files are replaced; inputs never "
                             "are)")


def add_run_folder(parser: argparse.ArgumentParser, out_help: str) -> None:
    """``--out``, ``--resume``, ``--quiet`` and ``--force`` of the commands that write a run
    folder."""
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--resume", action="store_true", help="continue the run in --out")
    add_quiet(parser)
    add_force(parser)


def add_device(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--device`` (default cpu)."""
    parser.add_argument("--device", default="cpu", help=help)


def add_json(parser: argparse.ArgumentParser, help: str = RECORDS_JSON_HELP) -> None:
    """``--json FILE``: where to save the results as JSON (default: nowhere)."""
    parser.add_argument("--json", default=None, metavar="FILE", help=help)


def add_plot(parser: argparse.ArgumentParser, help: str) -> None:
    """``--plot FILE.png``: where to draw the results (default: nowhere)."""
    parser.add_argument("--plot", default=None, metavar="FILE.png", help=help)


def add_reps(parser: argparse.ArgumentParser, default: int) -> None:
    """``--reps``: a benchmark's timed repetitions per candidate, at least ``MIN_REPS``."""
    parser.add_argument("--reps", type=at_least(MIN_REPS), default=default,
                        help=f"timed repetitions per candidate (>= {MIN_REPS})")


def add_seq_lens(parser: argparse.ArgumentParser, default: list[int],
                 help: str | None = None) -> None:
    """``--seq-lens T1,T2,...``: the sequence lengths a benchmark measures."""
    parser.add_argument("--seq-lens", type=csv_list(int, 1), default=default,
                        metavar="T1,T2,...", help=help)


def add_batch(parser: argparse.ArgumentParser) -> None:
    """``--batch``: a benchmark's batch size (default 1)."""
    parser.add_argument("--batch", type=at_least(1), default=1)


def add_attention_shape(parser: argparse.ArgumentParser, heads: int) -> None:
    """``--heads``, ``--d-head`` and ``--batch``: the shape of a benchmark's q, k and v."""
    parser.add_argument("--heads", type=at_least(1), default=heads)
    parser.add_argument("--d-head", type=at_least(1), default=64)
    add_batch(parser)


def add_preset(parser: argparse.ArgumentParser) -> None:
    """``--preset``: the layer sizes a benchmark of SwitchHead layers uses."""
    parser.add_argument("--preset", default="wt103-47m")


def add_passes(parser: argparse.ArgumentParser, default: list[str]) -> None:
    """``--passes``: forward alone and/or forward and backward."""
    parser.add_argument("--passes", nargs="+", choices=["fwd", "fwdbwd"], default=default)


def add_converted_model(parser: argparse.ArgumentParser, cores_help: str) -> None:
    """``--model`` and ``--gguf-file`` (default: a small random Llama), and ``--core CORE``
    (repeatable): a Hugging Face model and the attention cores it is converted to."""
    add_model(parser, required=False)
    parser.add_argument("--core", action="append", default=[], metavar="CORE",
                        help=cores_help)
