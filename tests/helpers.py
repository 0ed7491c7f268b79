"""Small helpers shared by tests."""

import contextlib
import hashlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from attnlab.layers import Registry


def tree_checksums(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``root`` (a file: just itself), to
    check that a refused command left it exactly as it was."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root) if p != root else p.name):
            hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def dump_config(cfg: dict, path: Path) -> str:
    """Write a run-config dict as YAML to ``path``; returns the path as a string."""
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def tiny_run_config(corpus: Path, cache_dir: Path, steps: int, batch_size: int = 2) -> dict:
    """A run-config dict of a 2-layer, d=32 model on ``corpus`` (a text file) that trains
    ``steps`` steps of ``batch_size`` x 32 tokens, evaluates once at the end on 512 tokens
    and checkpoints at the end."""
    return {"model": {"d_model": 32, "n_layers": 2, "d_ff": 64, "max_seq_len": 64,
                      "attention": {"n_heads": 2}},
            "data": {"corpus": "text", "path": str(corpus), "cache_dir": str(cache_dir)},
            "train": {"steps": steps, "batch_size": batch_size, "seq_len": 32,
                      "eval_every": 0, "eval_tokens": 512, "final_eval_tokens": 512,
                      "ckpt_every": steps, "log_every": steps}}


@contextlib.contextmanager
def plugin_module(folder: Path, monkeypatch: pytest.MonkeyPatch, name: str, code: str,
                  registry: Registry, part: str) -> Iterator[str]:
    """``code`` saved as module ``name`` in ``folder`` (the working directory, as a user runs
    ``attnlab --plugin name``); afterwards the module is forgotten and the ``part`` it
    registers in ``registry`` removed."""
    (folder / f"{name}.py").write_text(code)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        yield name
    finally:
        sys.modules.pop(name, None)
        if part in registry.names():
            registry.unregister(part)


def triton_on_this_machine() -> bool:
    """Whether triton is installed. Where it is and no GPU exists, its kernels run in the
    interpreter on CPU tensors: ``TRITON_INTERPRET=1``, which triton reads when a kernel
    is defined, so ``conftest.py`` calls this before any test module is imported."""
    installed = importlib.util.find_spec("triton") is not None
    if installed and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return installed
