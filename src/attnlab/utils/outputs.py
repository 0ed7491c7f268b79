"""The one write policy of every attnlab command that writes a file or a folder.

A command writes only where that destroys nothing it did not make:

- a **folder** output (``export``, ``report``, ``visualize``, ``demo``; a new ``train`` or
  ``distill`` run) goes into a folder that is absent, empty, or was made by the same command:
  its :data:`OWNER_FILE` says so, or, for folders written before that file existed, the
  files every such folder holds (:data:`SIGNATURES`);
- a **file** output (``--json``, ``--plot``, ``match --out``) replaces only a file attnlab
  wrote for such an option (:func:`file_kind`);
- anything else (a training run, another command's output, a folder holding the command's
  inputs, a file of another kind) is refused with :class:`OutputRefused` unless ``force``
  is given, and then only the files the command writes are replaced: nothing else there is
  removed, and the owner file of a folder the command does not own is not written;
- the command's own inputs are never replaced, with or without ``force``.

Every check runs before any work. New files keep the permissions the umask gives.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab import __version__
from attnlab.utils.io import atomic_write_json, fsync_dir, fsync_tree, write_folder

OWNER_FILE = ".attnlab-output.json"

# command -> (files that every folder it made holds, what such a folder is called)
SIGNATURES: dict[str, tuple[tuple[str, ...], str]] = {
    "train": (("config.yaml",), "an attnlab training run"),
    "distill": (("distill.yaml",), "an attnlab distillation"),
    "demo": (("plan.json",), "an attnlab demo"),
    "report": (("report.md", "results.json"), "an attnlab report"),
    "visualize": (("visualize.json",), "the output of attnlab visualize"),
    "export": (("config.json",), "an exported attnlab model"),
}
HF_MODEL = "a Hugging Face model folder"
PNG_SOFTWARE = "attnlab"  # the PNG "Software" text chunk of every figure attnlab saves
MODEL_FOLDERS = ("train", "distill", "export", "hf-model")  # no --json or --plot file goes inside


class OutputRefused(ValueError):
    """A destination holds something the command did not make (or is one of its inputs)."""


def read_owner(folder: Path) -> dict[str, Any] | None:
    """The owner record of a folder attnlab made (``{"command", "files"?}``), or None."""
    try:
        record = json.loads((folder / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "command" in record else None


def folder_owner(folder: Path) -> str | None:
    """The command that made ``folder`` (``"train"``, ``"report"``, ...), ``"hf-model"`` for
    a Hugging Face model folder not exported by attnlab, or None when no command did."""
    if (record := read_owner(folder)) is not None:
        return str(record["command"])
    for command, (files, _) in SIGNATURES.items():
        if all((folder / name).exists() for name in files):
            if command == "export":
                return "export" if _model_type(folder / "config.json") == "attnlab" else "hf-model"
            return command
    return None


def _model_type(config: Path) -> object:
    try:
        return json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def describe_folder(folder: Path) -> str:
    """What a non-empty folder holds, in words for an error message."""
    owner = folder_owner(folder)
    if owner == "hf-model":
        return HF_MODEL
    if owner is not None:
        return SIGNATURES[owner][1]
    count = sum(1 for _ in folder.iterdir())
    return f"{count} entr{'y' if count == 1 else 'ies'} attnlab did not write"


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _resolved(paths: Iterable[str | os.PathLike[str]]) -> tuple[Path, ...]:
    return tuple(Path(p).resolve() for p in paths)


@dataclass(frozen=True)
class OutputFolder:
    """The folder a command writes. ``check`` before any work; then ``claim`` (commands that
    write into it piece by piece) or ``write`` (commands that write it whole).

    ``command``: the writing command's name (a key of :data:`SIGNATURES`); ``option``: how
    the user named the folder, for messages; ``inputs``: files and folders the command reads.
    """

    path: Path
    command: str
    option: str = "--out"
    force: bool = False
    inputs: Sequence[Path] = field(default_factory=tuple)

    @classmethod
    def of(cls, path: str | os.PathLike[str], command: str, *, option: str = "--out",
           force: bool = False, inputs: Iterable[str | os.PathLike[str]] = ()
           ) -> OutputFolder:
        return cls(Path(path).resolve(), command, option, force, _resolved(inputs))

    @property
    def owned(self) -> bool:
        """Absent, empty, or made by this command."""
        return (not self.path.exists() or not any(self.path.iterdir())
                or folder_owner(self.path) == self.command)

    def check(self) -> None:
        """``OutputRefused`` unless the command may write here (see the module's policy)."""
        where = f"{self.option} {self.path}"
        if self.path.exists() and not self.path.is_dir():
            raise OutputRefused(f"{where} is a file; give a folder")
        for source in self.inputs:
            if source == self.path:
                raise OutputRefused(f"{where} is the folder this command reads; choose "
                                    "another folder")
            if _is_within(source, self.path) and not self.force:
                raise OutputRefused(
                    f"{where} holds {source}, which this command reads; choose another "
                    "folder (or --force to write beside it: only the files this command "
                    "writes are replaced)")
        if self.owned or self.force:
            return
        raise OutputRefused(
            f"{where} already holds {describe_folder(self.path)}; choose another folder, "
            f"or pass --force to write attnlab {self.command}'s files beside what is there "
            "(nothing else is removed)")

    def claim(self) -> Path:
        """Create the folder and, when the command owns it, record that it does."""
        self.path.mkdir(parents=True, exist_ok=True)
        if self.owned and read_owner(self.path) is None:
            _write_owner(self.path, self.command, None)
        return self.path

    def write(self, fill: Callable[[Path], None]) -> Path:
        """Write the folder crash-safely: ``fill`` writes into a temporary folder. An absent
        folder, or one holding only what this command wrote there before, is then replaced
        whole (:func:`~attnlab.utils.io.write_folder`: a crash leaves one complete folder);
        into any other folder (``force``, or the current folder) each file is moved in by
        one rename, and the files this command wrote there before and writes no more are
        removed. No file of the command's inputs (or inside an input folder) is replaced."""
        if self._swappable():
            def fill_owned(tmp: Path) -> None:
                fill(tmp)
                _write_owner(tmp, self.command, _files_under(tmp))

            write_folder(self.path, fill_owned)
            return self.path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=f".tmp-{self.path.name}-"))
        try:
            fill(tmp)
            self._move_in(tmp, _files_under(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self.path

    def _swappable(self) -> bool:
        """Absent, or holding only this command's files, and not the current folder."""
        if not self.path.exists():
            return True
        if _is_within(Path.cwd(), self.path):
            return False
        record = read_owner(self.path) or {}
        ours = {OWNER_FILE, *record.get("files", ())} if record.get(
            "command") == self.command else set()
        return set(_files_under(self.path)) <= ours

    def _move_in(self, tmp: Path, files: list[str]) -> None:
        targets = [self.path / name for name in files]
        if clash := [str(t) for t in targets
                     if any(_is_within(t.resolve(), source) for source in self.inputs)]:
            raise OutputRefused(f"{self.option} {self.path}: writing there would replace "
                                f"{', '.join(clash)}, which this command reads; choose "
                                "another folder")
        fsync_tree(tmp)
        owned = self.owned
        before = read_owner(self.path) or {}
        self.path.mkdir(parents=True, exist_ok=True)
        for name, target in zip(files, targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / name, target)
        if owned:
            if before.get("command") == self.command:
                for name in set(before.get("files") or ()) - set(files):
                    (self.path / name).unlink(missing_ok=True)
            _write_owner(self.path, self.command, files)
        fsync_dir(self.path)


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _write_owner(folder: Path, command: str, files: list[str] | None) -> None:
    record: dict[str, Any] = {"command": command, "attnlab": __version__}
    if files is not None:
        record["files"] = files
    atomic_write_json(folder / OWNER_FILE, record)


# ---------------------------------------------------------------- single files


def file_kind(path: Path) -> str | None:
    """Which attnlab file option wrote ``path``: ``"json"`` (a result record: bench, long
    context, match), ``"png"`` (a figure attnlab saved), ``"yaml"`` (a matched config), or
    None for any other file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if data.startswith(b"\x89PNG"):
        return "png" if b"Software\x00" + PNG_SOFTWARE.encode() in data[:1 << 20] else None
    if data.startswith(b"# Matched by `attnlab match`"):
        return "yaml"
    try:
        payload = json.loads(data)
    except ValueError:  # not JSON, or not UTF-8
        return None
    if isinstance(payload, dict) and ("written_by" in payload or {"machine", "results"}
                                      <= payload.keys() or "bench" in payload):
        return "json"
    return None


def check_output_file(path: str | os.PathLike[str], kind: str, *, option: str,
                      force: bool = False, inputs: Iterable[str | os.PathLike[str]] = ()
                      ) -> None:
    """``OutputRefused`` unless ``path`` may be written by a file option of ``kind`` (see
    :func:`file_kind`): absent, or written by attnlab for such an option, or ``force``; never
    one of ``inputs``, never a file inside a folder another command made."""
    target = Path(path).resolve()
    where = f"{option} {path}"
    if target in _resolved(inputs):
        raise OutputRefused(f"{where} is a file this command reads; write to another file")
    owner = folder_owner(target.parent) if target.parent.is_dir() else None
    if owner in MODEL_FOLDERS and not force:
        raise OutputRefused(f"{where} is inside {describe_folder(target.parent)} "
                            f"({target.parent}); write to another folder (or --force)")
    if not target.exists() or target.is_dir() or force:
        return
    if file_kind(target) != kind:
        raise OutputRefused(
            f"{where} already exists and attnlab did not write it for such an option; "
            "choose another file, or pass --force to replace it")
