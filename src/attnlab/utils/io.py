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


def fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` and the folders themselves, first giving each file
    the permissions the umask gives a new file (libraries that write through a temporary
    file, such as safetensors, leave 0600, which a serving process of another user cannot
    read)."""
    mode = 0o666 & ~current_umask()
    for path in folder.rglob("*"):
        if path.is_file():
            os.chmod(path, mode)
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        fsync_dir(sub)


def current_umask() -> int:
    """This process's umask (read without changing it where /proc allows)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file handle whose content replaces ``path`` only once complete.

    On success the temporary file is fsynced and ``os.replace``-d onto ``path``; on error it is
    deleted. Concurrent writers do not collide. The file gets the permissions the umask gives
    any new file (readable by others under the usual 022), not ``mkstemp``'s 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; a new file is 0666 - umask
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
    ``.old-NAME-PID``), and the old one is removed. A failure removes the temporary folder.

    It replaces ``final`` whole: callers decide that ``final`` is theirs to replace
    (:class:`attnlab.utils.outputs.OutputFolder`)."""
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in [*parent.glob(f".tmp-{final.name}-*"), *parent.glob(f".old-{final.name}-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = parent / f".tmp-{final.name}-{os.getpid()}"
    old = parent / f".old-{final.name}-{os.getpid()}"
    try:
        tmp.mkdir()
        write(tmp)
        fsync_tree(tmp)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
