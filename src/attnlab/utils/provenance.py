"""What a recorded figure was measured on: the model (a short fingerprint of its files) and
the cores this process may use, so that a figure can be traced to its model and machine and
figures of different models are never joined."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FINGERPRINT_HEX = 12
"""Hex digits of a fingerprint (48 bits: two models collide with odds of 1 in 2.8e14)."""
SAMPLE_BYTES = 1 << 20
"""Bytes read from each end of a weights file: enough to tell fine-tunes of one
architecture apart (same names and sizes, other values) without reading gigabytes."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where the
    system has none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_threads(threads: int) -> None:
    """``ValueError`` when ``threads`` exceeds :func:`available_cores`: threads beyond the
    cores share them, so every timing measures the oversubscription (which hits a model of
    many small ops far harder than one of a few large ones), not the model."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    cores = available_cores()
    if threads > cores:
        raise ValueError(f"{threads} threads on {cores} CPU cores: the extra threads would "
                         f"share cores and distort every timing; give at most {cores}")


def _short(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_HEX]


def _file_sample(path: Path) -> dict[str, Any]:
    """Name, size and the sha256 of the first and last :data:`SAMPLE_BYTES` of a file."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(SAMPLE_BYTES))
        if size > SAMPLE_BYTES:
            f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
            digest.update(f.read())
    return {"name": path.name, "size": size, "sample_sha256": digest.hexdigest()}


def model_fingerprint(folder: str | os.PathLike[str], gguf_file: str | None = None) -> str:
    """A short hash of what makes the model in ``folder``: ``config.json``'s bytes (when
    there is one) and each weights file's name, size and sampled bytes (the GGUF file given,
    else every ``*.safetensors``, ``*.bin``, ``*.gguf`` or ``*.pt`` file of the folder). The
    same files anywhere give the same fingerprint; another model or another quantisation, a
    different one. ``OSError`` when the folder or the GGUF file cannot be read."""
    folder = Path(folder)
    config = folder / "config.json"
    weights = ([folder / gguf_file] if gguf_file else
               sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES))
    return _short({
        "config_sha256": (hashlib.sha256(config.read_bytes()).hexdigest()
                          if config.is_file() else None),
        "weights": [_file_sample(p) for p in weights]})


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """A short hash of a model built in memory from ``config`` (its seed included)."""
    return _short(dict(config))
