"""The common interface of corpus readers: deterministic streams of text per split."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path

SPLITS = ("train", "valid", "test")

Chunk = str | bytes
"""A piece of a split: text, or raw bytes for byte-level corpora (enwik8)."""


def chunk_nbytes(chunk: Chunk) -> int:
    """Length of ``chunk`` in UTF-8 bytes."""
    return len(chunk) if isinstance(chunk, bytes) else len(chunk.encode("utf-8"))


def take_bytes(chunks: Iterable[Chunk], limit: int | None) -> Iterator[Chunk]:
    """Yield ``chunks`` until ``limit`` UTF-8 bytes have been yielded, then stop consuming.

    The chunk that crosses the limit is cut; a text chunk is cut on a character boundary, so
    slightly fewer than ``limit`` bytes may come out.
    """
    if limit is None:
        yield from chunks
        return
    remaining = limit
    for chunk in chunks:
        size = chunk_nbytes(chunk)
        if size >= remaining:
            if isinstance(chunk, bytes):
                yield chunk[:remaining]
            else:
                yield chunk.encode("utf-8")[:remaining].decode("utf-8", errors="ignore")
            return
        remaining -= size
        yield chunk


class CorpusSource(ABC):
    """A corpus on disk, read as three deterministic streams of chunks.

    Subclasses implement ``_read``; ``read`` applies the training-byte cap. Reading the same
    split twice yields the same chunks, whatever order the file system lists files in.
    """

    byte_level = False
    """True when chunks are raw bytes that only the byte tokenizer can encode."""

    def __init__(self, name: str, max_train_bytes: int | None = None) -> None:
        self.name = name
        self.max_train_bytes = max_train_bytes

    @abstractmethod
    def files(self) -> list[Path]:
        """Every file the corpus is read from, sorted (used to fingerprint caches)."""

    @abstractmethod
    def _read(self, split: str) -> Iterator[Chunk]:
        """All chunks of ``split``, uncapped."""

    def read(self, split: str) -> Iterator[Chunk]:
        """Chunks of ``split`` (one of ``SPLITS``); train stops after ``max_train_bytes``."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
        chunks = self._read(split)
        return take_bytes(chunks, self.max_train_bytes) if split == "train" else chunks
