"""Argument types of the command line: checked numbers and lists, config names, YAML cores.

Each raises ``argparse.ArgumentTypeError`` (or ``ValueError``), so a bad value is refused by
argparse before any work starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from attnlab.config import builtin_config


def resolve_config_path(value: str) -> Path:
    """``value`` as a path: a YAML file's (or an existing path) as given, else the built-in
    config of that name."""
    path = Path(value)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return builtin_config(value)


def number(kind: type, low: float | None = None, *,
           above: float | None = None) -> Callable[[str], int | float]:
    """An argparse type: a ``kind`` number ``>= low`` (or ``> above``)."""
    def parse(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {value!r}") from err
        if not math.isfinite(number):  # inf would pass "> 0"; nan passes or fails by chance
            raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
        if low is not None and number < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if above is not None and not number > above:
            raise argparse.ArgumentTypeError(f"must be greater than {above}, got {value}")
        return number

    return parse


def at_least(low: int) -> Callable[[str], int | float]:
    """An argparse type: an integer ``>= low``."""
    return number(int, low)


def layer_or_all(value: str) -> int | None:
    """An argparse type: an integer index, or ``all`` (None)."""
    if value.strip().lower() == "all":
        return None
    try:
        return int(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected an integer or 'all', got {value!r}") from err


MIN_REPS = 5  # attnlab.results.MIN_REPS, spelled out: that module imports torch


def csv_list(kind: type, low: float | None = None) -> Callable[[str], list]:
    """An argparse type: a comma-separated list of ``kind`` values (each ``>= low`` when
    given)."""
    item = number(kind, low) if kind in (int, float) else kind

    def parse(value: str) -> list:
        try:
            return [item(v.strip()) for v in value.split(",") if v.strip()]
        except (ValueError, argparse.ArgumentTypeError) as err:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__} values: {err}") from err

    return parse


def yaml_core(text: str) -> object:
    """A ``--core`` value: a name or a YAML mapping; ``ValueError`` for invalid YAML."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"--core {text!r} is not valid YAML: {err}") from err
