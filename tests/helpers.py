"""Small helpers shared by tests."""

from pathlib import Path

import yaml


def dump_config(cfg: dict, path: Path) -> str:
    """Write a run-config dict as YAML to ``path``; returns the path as a string."""
    path.write_text(yaml.safe_dump(cfg))
    return str(path)
