"""C4 and peS2o: folders of JSON-lines shards whose records carry a ``"text"`` field.

Shards are ``.json`` / ``.jsonl`` files, optionally compressed (``.gz``, ``.zst``), found
recursively and read in order of their relative paths, streamed line by line. A shard belongs
to a split by the words of its relative path: ``train`` -> train, ``valid`` or ``validation``
-> validation (e.g. ``c4-train.00000-of-01024.json.gz``, ``valid/part_0.jsonl.zst``); other
shards are ignored with a warning. The validation documents are halved: the first
``ceil(n / 2)`` form the ``valid`` split and the remaining ``floor(n / 2)`` the ``test`` split.
Each document is followed by a newline.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

from .config import PATH_FORMATS
from .documents import SEPARATOR
from .sources import Chunk, CorpusSource
from .textio import iter_lines, walk_files

logger = logging.getLogger(__name__)

SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz", ".json.zst", ".jsonl.zst")
VALID_WORDS = frozenset({"valid", "validation"})
TRAIN_WORDS = frozenset({"train"})

_Record = tuple[Path, int, bytes]


def shard_split(relative_path: str) -> str | None:
    """``train``, ``valid`` or ``None`` for a shard, from the words of its relative path."""
    words = set(re.split(r"[^a-z0-9]+", relative_path.lower()))
    is_valid, is_train = bool(words & VALID_WORDS), bool(words & TRAIN_WORDS)
    if is_valid and is_train:
        raise ValueError(f"shard {relative_path!r} names both train and validation")
    return "valid" if is_valid else "train" if is_train else None


class JsonLinesSource(CorpusSource):
    """Streams the ``"text"`` of every record of the train or validation shards of a folder."""

    def __init__(self, name: str, path: str | Path, max_train_bytes: int | None = None) -> None:
        super().__init__(name, max_train_bytes)
        folder = Path(path).expanduser()
        expected = f"expected {PATH_FORMATS[name]}"
        if not folder.is_dir():
            raise FileNotFoundError(f"corpus {name!r}: {folder} is not a folder; {expected}")
        self.shards: dict[str, list[Path]] = {"train": [], "valid": []}
        ignored = []
        for shard in walk_files(folder, SUFFIXES):
            relative = shard.relative_to(folder).as_posix()
            split = shard_split(relative)
            (self.shards[split] if split else ignored).append(shard)
        if ignored:
            logger.warning(
                "%s: ignoring %d shards named neither train nor validation: %s",
                name,
                len(ignored),
                [p.name for p in ignored[:5]],
            )
        for split, label in (("train", "train"), ("valid", "validation")):
            if not self.shards[split]:
                raise FileNotFoundError(
                    f"corpus {name!r}: no {label} shards (*{'/'.join(SUFFIXES)}) under {folder}; "
                    f"{expected}"
                )

    def files(self) -> list[Path]:
        return self.shards["train"] + self.shards["valid"]

    @staticmethod
    def _records(shards: list[Path]) -> Iterator[_Record]:
        for shard in shards:
            for lineno, line in enumerate(iter_lines(shard), start=1):
                if line.strip():
                    yield shard, lineno, line

    def _text(self, record: _Record) -> str:
        shard, lineno, line = record
        try:
            obj = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{shard}:{lineno}: not a JSON line ({err})") from err
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise ValueError(
                f"{shard}:{lineno}: JSON line without a string 'text' field; "
                f"expected {PATH_FORMATS[self.name]}"
            )
        return obj["text"]

    @cached_property
    def n_valid_documents(self) -> int:
        """Validation documents that form the ``valid`` split (the first half, rounded up)."""
        total = sum(1 for _ in self._records(self.shards["valid"]))
        return (total + 1) // 2

    def _read(self, split: str) -> Iterator[Chunk]:
        if split == "train":
            records = self._records(self.shards["train"])
        elif split == "valid":
            records = itertools.islice(self._records(self.shards["valid"]), self.n_valid_documents)
        else:
            records = itertools.islice(
                self._records(self.shards["valid"]), self.n_valid_documents, None
            )
        for record in records:
            yield self._text(record) + SEPARATOR
