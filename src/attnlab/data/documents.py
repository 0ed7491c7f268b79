"""Document collections and the rule that splits them into train / valid / test.

Split rule (deterministic, independent of file-system listing order):

* A collection of several documents is split by whole documents. Documents are grouped by
  their ``key`` (documents sharing a key, e.g. two editions of one play, always share a split)
  and the groups are visited in order of the SHA-256 of the key. A group goes to ``valid`` if
  half of it still fits in valid's byte budget (``valid_fraction`` of all bytes), else to
  ``test`` if half of it fits in test's budget, else to ``train``. Each split is its
  documents in that order (by name within a group), each followed by a newline. Split sizes
  miss their fractions by at most about half a group.
* A single document (e.g. one text file) is cut contiguously: the first
  ``1 - valid_fraction - test_fraction`` of its bytes are train, then valid, then test (cuts
  moved forward to the next UTF-8 character boundary).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .sources import SPLITS, Chunk, CorpusSource
from .textio import char_boundary, iter_text_blocks

SEPARATOR = "\n"
"""Appended after every document of a multi-document split."""


@dataclass(frozen=True)
class Document:
    """One UTF-8 document of a collection.

    Attributes:
        key: split group; documents with equal keys always land in the same split.
        name: unique name (orders documents within a group, names them in errors).
        size: length in bytes.
        open: returns a fresh binary file object over the document's bytes.
    """

    key: str
    name: str
    size: int
    open: Callable[[], BinaryIO]


def file_document(path: Path, name: str, key: str | None = None) -> Document:
    """A document read lazily from ``path`` (key defaults to ``name``)."""
    opener = functools.partial(open, path, "rb")
    return Document(key if key is not None else name, name, path.stat().st_size, opener)


@dataclass(frozen=True)
class _Piece:
    document: Document
    start: int
    end: int


def _hash_order(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class DocumentSource(CorpusSource):
    """A corpus made of documents, split by the rule in this module's docstring."""

    def __init__(
        self,
        name: str,
        documents: Sequence[Document],
        files: Sequence[Path],
        origin: str,
        valid_fraction: float,
        test_fraction: float,
        max_train_bytes: int | None = None,
    ) -> None:
        super().__init__(name, max_train_bytes)
        if not documents:
            raise ValueError(f"corpus {name!r}: found no documents in {origin}")
        self._files = sorted(files)
        self._separator = SEPARATOR if len(documents) > 1 else ""
        if len(documents) == 1:
            self._plan = self._cut_single(documents[0], valid_fraction, test_fraction)
        else:
            self._plan = self._assign_groups(documents, valid_fraction, test_fraction)
        empty = [split for split in SPLITS if not self._plan[split]]
        if empty:
            single = len(documents) == 1
            problem = (
                f"{origin} ({documents[0].size} bytes) is too short to cut"
                if single
                else f"{len(documents)} documents in {origin} are too few"
            )
            raise ValueError(
                f"corpus {name!r}: {problem} to fill split(s) {empty} with "
                f"valid_fraction={valid_fraction}, test_fraction={test_fraction}; add text"
                + ("" if single else ", or give a single file (cut contiguously)")
            )

    def _assign_groups(
        self, documents: Sequence[Document], valid_fraction: float, test_fraction: float
    ) -> dict[str, list[_Piece]]:
        groups: dict[str, list[Document]] = {}
        for doc in sorted(documents, key=lambda d: d.name):
            groups.setdefault(doc.key, []).append(doc)
        sep = len(self._separator)
        sizes = {key: sum(d.size + sep for d in docs) for key, docs in groups.items()}
        total = sum(sizes.values())
        budgets = {"valid": valid_fraction * total, "test": test_fraction * total}
        filled = dict.fromkeys(SPLITS, 0)
        plan: dict[str, list[_Piece]] = {split: [] for split in SPLITS}
        for key in sorted(groups, key=lambda k: (_hash_order(k), k)):
            fits = (s for s in budgets if filled[s] + sizes[key] / 2 <= budgets[s])
            split = next(fits, "train")
            filled[split] += sizes[key]
            plan[split].extend(_Piece(doc, 0, doc.size) for doc in groups[key])
        return plan

    @staticmethod
    def _cut_single(
        doc: Document, valid_fraction: float, test_fraction: float
    ) -> dict[str, list[_Piece]]:
        with doc.open() as fh:
            cuts = [
                char_boundary(fh, round(doc.size * fraction), doc.size)
                for fraction in (1.0 - valid_fraction - test_fraction, 1.0 - test_fraction)
            ]
        bounds = [0, *cuts, doc.size]
        return {
            split: [_Piece(doc, lo, hi)] if hi > lo else []
            for split, lo, hi in zip(SPLITS, bounds[:-1], bounds[1:], strict=True)
        }

    def files(self) -> list[Path]:
        return list(self._files)

    def documents(self, split: str) -> list[str]:
        """Names of the documents that ``split`` reads from, in reading order."""
        return [piece.document.name for piece in self._plan[split]]

    def read_documents(self, split: str) -> Iterator[tuple[str, str]]:
        """``(name, text)`` of each document (or piece of one) of ``split``, in order."""
        for piece in self._plan[split]:
            with piece.document.open() as fh:
                blocks = iter_text_blocks(fh, piece.start, piece.end, piece.document.name)
                yield piece.document.name, "".join(blocks)

    def _read(self, split: str) -> Iterator[Chunk]:
        for piece in self._plan[split]:
            with piece.document.open() as fh:
                yield from iter_text_blocks(fh, piece.start, piece.end, piece.document.name)
            if self._separator:
                yield self._separator
