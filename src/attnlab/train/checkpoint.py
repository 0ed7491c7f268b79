"""Checkpoints: safetensors weights + optimizer/RNG/data state, written crash-safely.

Layout of a run directory::

    checkpoints/step-00000500/{model.safetensors, state.pt, meta.json}
    checkpoints/latest          # text file naming the newest *complete* checkpoint

A *sharded* checkpoint (FSDP runs) holds ``shards/`` instead of ``model.safetensors``: model
and optimizer state written by every rank with ``torch.distributed.checkpoint``, which loads
on any number of processes (one included, e.g. for ``attnlab eval``).

A checkpoint is assembled in a temporary folder, every file fsynced, then renamed into
place; only then is ``latest`` (atomically) pointed at it. A crash at any moment, of any
rank, leaves ``latest`` naming a complete checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from attnlab.train.distributed import (
    Dist,
    checkpoint_state,
    is_fsdp,
    load_checkpoint_state,
    unwrap,
)
from attnlab.utils.io import atomic_write_text, fsync_dir, fsync_tree
from attnlab.utils.readers import read_json, read_text

logger = logging.getLogger(__name__)

T = TypeVar("T")

FORMAT_VERSION = 1
SHARDS = "shards"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not match the model."""


@dataclasses.dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]  # optimizer, RNG, data position, anything else the trainer saved


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: nn.Module,
    state: dict[str, Any],
    keep: int = 2,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    sharded: bool = False,
    dist: Dist | None = None,
) -> Path:
    """Write checkpoint ``step`` for ``model`` plus trainer ``state``; keep the newest ``keep``.

    ``sharded``: model and ``optimizer`` go to ``shards/`` (every rank writes its part; all
    ranks must call this), else ``model`` (DDP-wrapped or not) to one safetensors file and
    ``optimizer`` into ``state``. With several processes only rank 0 writes the rest, and
    ``state`` must already be the whole job's (see ``Dist.all_gather_rows``).
    """
    dist = dist or Dist()
    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}-{dist.broadcast_object(os.getpid())}"
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    if sharded:
        import torch.distributed.checkpoint as dcp

        dist.barrier()  # tmp exists
        _quiet(dcp.save, checkpoint_state(model, optimizer), checkpoint_id=tmp / SHARDS)
        dist.barrier()  # every shard is written
    if dist.is_main:
        if not sharded:
            save_model(unwrap(model), str(tmp / "model.safetensors"))
            if optimizer is not None:
                state = {**state, "optimizer": optimizer.state_dict()}
        torch.save(state, tmp / "state.pt")
        meta = {"format": FORMAT_VERSION, "step": step, "sharded": sharded}
        (tmp / "meta.json").write_text(json.dumps(meta))
        fsync_tree(tmp)  # with the umask's permissions
        if final.exists():  # re-saving a step (e.g. after resume) replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
        atomic_write_text(root / "latest", final.name + "\n")
        _prune(root, keep)
        logger.info("saved checkpoint %s", final)
    dist.barrier()  # no rank runs ahead of a checkpoint that is not complete yet
    return final


def _quiet(dcp_function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a ``torch.distributed.checkpoint`` function (it fsyncs the files it writes)
    without its warning that, with no process group, it works on one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*single process")
        return dcp_function(*args, **kwargs)


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Folder of the newest complete checkpoint of ``run_dir``, or None if it has none."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / read_text(pointer, "the name of the newest checkpoint").strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist")
    return path


def load_checkpoint(
    run_dir: str | Path,
    model: nn.Module,
    map_location: str | torch.device = "cpu",
    optimizer: torch.optim.Optimizer | None = None,
) -> Checkpoint:
    """Load the newest checkpoint of ``run_dir`` into ``model`` (strictly) and return it.

    ``model`` may be DDP- or FSDP-wrapped (FSDP needs a sharded checkpoint); with
    ``optimizer`` its state (moments, step counts) is restored too, while each group's
    settings (learning rate, weight decay, betas, ``lr_mult``) stay those it was built with
    from the current config, which a resumed run records. A sharded checkpoint is read
    collectively when a process group is up, so every rank must call this.
    """
    path = latest_checkpoint(run_dir)
    if path is None:
        raise CheckpointError(f"no checkpoint in {run_dir} (expected {run_dir}/checkpoints/latest)")
    return load_checkpoint_at(path, model, map_location, optimizer)


def is_sharded(path: Path) -> bool:
    """Whether the checkpoint folder ``path`` holds FSDP-style shards."""
    return (path / SHARDS).is_dir()


def load_checkpoint_at(
    path: Path,
    model: nn.Module,
    map_location: str | torch.device = "cpu",
    optimizer: torch.optim.Optimizer | None = None,
) -> Checkpoint:
    sharded = is_sharded(path)
    for name in ("state.pt", "meta.json") if sharded else ("model.safetensors", "state.pt",
                                                           "meta.json"):
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
    try:
        meta = read_json(path / "meta.json", "a checkpoint's metadata (its format and step)")
    except ValueError as err:  # damaged: one line, with the way on
        raise CheckpointError(f"{err}. {_older_checkpoint_hint(path)}") from err
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {meta.get('format')} is not {FORMAT_VERSION}"
        )
    if not isinstance(meta.get("step"), int):
        raise CheckpointError(f"{path / 'meta.json'} is corrupt: it holds no integer step. "
                              f"{_older_checkpoint_hint(path)}")
    settings = [] if optimizer is None else [
        {key: value for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups]
    if sharded:
        _load_shards(path / SHARDS, model, optimizer)
    else:
        _load_safetensors(path / "model.safetensors", model, map_location)
    try:
        state = torch.load(path / "state.pt", map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for a corrupt pickle/zip
        raise CheckpointError(
            f"{path / 'state.pt'} is corrupt: torch.load cannot read it "
            f"({type(err).__name__}). {_older_checkpoint_hint(path)}"
        ) from err
    if optimizer is not None and not sharded:
        optimizer.load_state_dict(state["optimizer"])
    if optimizer is not None:  # loading replaced the groups' settings with the saved ones
        for group, kept in zip(optimizer.param_groups, settings, strict=True):
            group.update(kept)
    return Checkpoint(path, int(meta["step"]), state)


def _older_checkpoint_hint(path: Path) -> str:
    """How to go on without the corrupt checkpoint ``path``."""
    return (f"Remove {path} and write the name of an older checkpoint into "
            f"{path.parent / 'latest'}, or start a new run")


def _load_safetensors(file: Path, model: nn.Module, map_location: str | torch.device) -> None:
    if is_fsdp(model):
        raise CheckpointError(
            f"{file.parent} is a single-file (DDP / one-process) checkpoint; resume it with "
            "train.distributed=ddp (FSDP resumes only the sharded checkpoints FSDP runs write)"
        )
    try:
        missing, unexpected = load_model(unwrap(model), str(file), strict=False,
                                         device=str(map_location))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{file} is corrupt: {err}. "
                              f"{_older_checkpoint_hint(file.parent)}") from err
    except RuntimeError as err:  # shape mismatches, one line each
        lines = [line.strip() for line in str(err).splitlines() if "mismatch" in line]
        first = lines[0] if lines else str(err).strip()
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        raise CheckpointError(
            f"checkpoint {file.parent} does not fit the model this config builds: {first}{more}; "
            "a resumed run keeps its model's shape (undo the model.* override, or start a "
            "new run)"
        ) from err
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {file.parent} does not fit the model this config builds: missing "
            f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )


def _load_shards(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
                 ) -> None:
    import torch.distributed.checkpoint as dcp

    state = checkpoint_state(model, optimizer)
    try:
        _quiet(dcp.load, state, checkpoint_id=folder)
    except Exception as err:  # DCP wraps reader and planner failures in several types
        raise CheckpointError(
            f"sharded checkpoint {folder.parent} could not be loaded into this model "
            f"(different config, or corrupt?): {err}"
        ) from err
    load_checkpoint_state(model, state, optimizer)
