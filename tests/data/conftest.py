"""Writers of small corpora in the real on-disk formats, for the data tests."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import zstandard

WORDS = "the quick brown fox jumps over a lazy dog while café naïve 日本 ünïcode text flows".split()


def make_text(seed: int, n_words: int) -> str:
    """Deterministic multi-line text with non-ASCII characters."""
    words = [WORDS[(seed * 7 + i * 13 + (i * i) % 5) % len(WORDS)] for i in range(n_words)]
    lines = [" ".join(words[i : i + 9]) for i in range(0, n_words, 9)]
    return f"document {seed}\n" + "\n".join(lines) + "\n"


def write_jsonl(path: Path, texts: Sequence[str], extra: dict | None = None) -> Path:
    """JSON lines with a "text" field, compressed by the file's suffix (.gz, .zst or none)."""
    data = "".join(json.dumps({"text": t, **(extra or {})}) + "\n" for t in texts).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


@pytest.fixture
def text_factory() -> Callable[[int, int], str]:
    return make_text


@pytest.fixture
def jsonl_writer() -> Callable[..., Path]:
    return write_jsonl
