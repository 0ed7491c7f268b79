"""On-disk cache of tokenised splits as memory-mapped ``.bin`` files.

Layout under the cache folder of one corpus fingerprint (see ``attnlab.data.load``)::

    tokens-<16 hex of the tokenizer identity>/
        train.bin valid.bin test.bin   raw little-endian ids, uint16 (vocab <= 65535) or uint32
        meta.json                      token and byte counts, dtype, tokenizer identity

Every file is written atomically and ``meta.json`` last, so an interrupted build is never
mistaken for a finished one: a folder is reused only when ``meta.json`` matches the tokenizer
and every ``.bin`` has the recorded length.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.utils.io import atomic_write_text, atomic_writer

from .sources import SPLITS, Chunk, CorpusSource, chunk_nbytes
from .textio import BLOCK_BYTES
from .tokenizers import Tokenizer

logger = logging.getLogger(__name__)

CACHE_VERSION = 1
"""Bump when reading or splitting rules change, to invalidate every existing cache."""

META_FILE = "meta.json"


def fingerprint(payload: Any) -> str:
    """SHA-256 hex digest of ``payload`` as canonical JSON."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def file_stamps(paths: Sequence[Path]) -> list[list[str | int]]:
    """``[resolved path, size, mtime_ns]`` of each file: changes when any file changes."""
    stamps: list[list[str | int]] = []
    for path in paths:
        stat = path.stat()
        stamps.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    return stamps


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` for vocabularies up to 65535 ids, else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def tokens_folder(corpus_dir: Path, tokenizer: Tokenizer) -> Path:
    """Where the token streams of ``tokenizer`` live inside a corpus cache folder."""
    return corpus_dir / f"tokens-{fingerprint(tokenizer.identity)[:16]}"


def _groups(chunks: Iterable[Chunk], target_bytes: int) -> Iterator[tuple[list[Chunk], int]]:
    """Consecutive chunks gathered into groups of about ``target_bytes`` (and their size)."""
    group: list[Chunk] = []
    size = 0
    for chunk in chunks:
        group.append(chunk)
        size += chunk_nbytes(chunk)
        if size >= target_bytes:
            yield group, size
            group, size = [], 0
    if group:
        yield group, size


def _write_split(
    path: Path, chunks: Iterable[Chunk], tokenizer: Tokenizer, dtype: np.dtype, what: str
) -> tuple[int, int]:
    """Tokenise ``chunks`` group by group into ``path``; return (tokens, UTF-8 bytes)."""
    n_tokens = n_bytes = 0
    with atomic_writer(path) as fh:
        for group, size in _groups(chunks, BLOCK_BYTES):
            ids = tokenizer.encode_batch(group)
            fh.write(ids.astype(dtype, copy=False).tobytes())
            n_tokens += len(ids)
            n_bytes += size
        if n_tokens == 0:
            raise ValueError(f"{what} is empty: no text to tokenise")
    return n_tokens, n_bytes


def read_meta(folder: Path, tokenizer: Tokenizer) -> dict[str, Any] | None:
    """The metadata of a complete cache in ``folder`` built with ``tokenizer``, else None."""
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if meta.get("version") != CACHE_VERSION or meta.get("tokenizer") != tokenizer.identity:
        return None
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in SPLITS:
        path = folder / f"{split}.bin"
        if not path.is_file() or path.stat().st_size != meta["tokens"][split] * itemsize:
            return None
    return meta


def build(folder: Path, source: CorpusSource, tokenizer: Tokenizer) -> dict[str, Any]:
    """Tokenise every split of ``source`` into ``folder``; return the metadata written."""
    dtype = token_dtype(tokenizer.vocab_size)
    meta: dict[str, Any] = {
        "version": CACHE_VERSION,
        "corpus": source.name,
        "tokenizer": tokenizer.identity,
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype.name,
        "tokens": {},
        "bytes": {},
    }
    for split in SPLITS:
        logger.info("tokenising the %s split of %s into %s", split, source.name, folder)
        what = f"split {split!r} of corpus {source.name!r}"
        n_tokens, n_bytes = _write_split(
            folder / f"{split}.bin", source.read(split), tokenizer, dtype, what
        )
        meta["tokens"][split] = n_tokens
        meta["bytes"][split] = n_bytes
        logger.info("%s: %d tokens from %d bytes", what, n_tokens, n_bytes)
    atomic_write_text(folder / META_FILE, json.dumps(meta, indent=1))
    return meta


def open_splits(folder: Path, meta: dict[str, Any]) -> dict[str, np.memmap]:
    """Read-only 1-D memmaps of the cached splits."""
    return {
        split: np.memmap(folder / f"{split}.bin", dtype=np.dtype(meta["dtype"]), mode="r")
        for split in SPLITS
    }
