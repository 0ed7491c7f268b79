"""Crash-safe file writes: write a temporary file (or folder), fsync it, rename it over the
target.

A killed process leaves either the old file or the complete new one, never a partial file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO


def default_cache_dir() -> Path:
    """``$ATTNLAB_CACHE`` if set, else ``~/.cache/attnlab``."""
    env = os.environ.get("ATTNLAB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "attnlab"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory entry (so a rename inside it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces ``path`` only once complete.

    On success the temporary file is fsynced and ``os.replace``-d onto ``path``; on error it is
    deleted. Concurrent writers do not collide.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_writer(path) as fh:
        fh.write(text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def unwritable_reason(path: str | os.PathLike[str], *, folder: bool = False) -> str | None:
    """Why ``path`` (a file, or a ``folder``) cannot be created or written, or None if it can.

    Checked before any work starts, so a long job never fails at its very end.
    """
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        return f"{path} is {'a file, not a folder' if folder else 'a folder, not a file path'}"
    parent = path if folder else path.absolute().parent
    existing = next(p for p in (parent, *parent.absolute().parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    try:  # os.access trusts permission bits; root, /proc or a full disk can still refuse
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        return f"{existing} does not take new files ({err.strerror or err})"
    return None


def write_folder(final: Path, write: Callable[[Path], None]) -> None:
    """Write a folder crash-safely: ``write`` fills a temporary sibling, every file is
    fsynced, then the old folder is moved aside and the new one renamed into place (a crash
    leaves either folder complete; only between the two renames is the old one under
    ``.old-NAME-PID``), and the old one is removed."""
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in [*parent.glob(f".tmp-{final.name}-*"), *parent.glob(f".old-{final.name}-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = parent / f".tmp-{final.name}-{os.getpid()}"
    old = parent / f".old-{final.name}-{os.getpid()}"
    write(tmp)
    for path in tmp.rglob("*"):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(tmp)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(parent)
    shutil.rmtree(old, ignore_errors=True)
