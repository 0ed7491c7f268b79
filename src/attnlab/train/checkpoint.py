"""Checkpoints: safetensors weights + optimizer/RNG/data state, written crash-safely.

Layout of a run directory::

    checkpoints/step-00000500/{model.safetensors, state.pt, meta.json}
    checkpoints/latest          # text file naming the newest *complete* checkpoint

A checkpoint is assembled in a temporary folder, every file fsynced, then renamed into
place; only then is ``latest`` (atomically) pointed at it. A crash at any moment leaves
``latest`` naming a complete checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from attnlab.utils.io import atomic_write_text, fsync_dir

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not match the model."""


@dataclasses.dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]  # optimizer, RNG, data position, anything else the trainer saved


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def save_checkpoint(
    run_dir: str | Path, step: int, model: nn.Module, state: dict[str, Any], keep: int = 2
) -> Path:
    """Write checkpoint ``step`` for ``model`` plus trainer ``state``; keep the newest ``keep``."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({"format": FORMAT_VERSION, "step": step}))
    for name in ("model.safetensors", "state.pt", "meta.json"):
        _fsync_file(tmp / name)
    fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after resume) replaces it
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(root)
    atomic_write_text(root / "latest", final.name + "\n")
    _prune(root, keep)
    logger.info("saved checkpoint %s", final)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Folder of the newest complete checkpoint of ``run_dir``, or None if it has none."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist")
    return path


def load_checkpoint(
    run_dir: str | Path, model: nn.Module, map_location: str | torch.device = "cpu"
) -> Checkpoint:
    """Load the newest checkpoint of ``run_dir`` into ``model`` (strictly) and return it."""
    path = latest_checkpoint(run_dir)
    if path is None:
        raise CheckpointError(f"no checkpoint in {run_dir} (expected {run_dir}/checkpoints/latest)")
    return load_checkpoint_at(path, model, map_location)


def load_checkpoint_at(
    path: Path, model: nn.Module, map_location: str | torch.device = "cpu"
) -> Checkpoint:
    for name in ("model.safetensors", "state.pt", "meta.json"):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
    try:
        meta = json.loads((path / "meta.json").read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path / 'meta.json'} is corrupt: {err}") from err
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {meta.get('format')} is not {FORMAT_VERSION}"
        )
    try:
        missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False,
                                         device=str(map_location))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path / 'model.safetensors'} is corrupt: {err}") from err
    except RuntimeError as err:  # shape mismatch
        raise CheckpointError(
            f"checkpoint {path} does not match the model (different config?): {err}"
        ) from err
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {path} does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    try:
        state = torch.load(path / "state.pt", map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for a corrupt pickle/zip
        raise CheckpointError(f"{path / 'state.pt'} is corrupt: {err}") from err
    return Checkpoint(path, int(meta["step"]), state)
