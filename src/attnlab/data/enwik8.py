"""enwik8: the first 10^8 bytes of an English Wikipedia XML dump, read as raw bytes.

Split: the first 90% of the bytes are train, the next 5% valid, the last 5% test: the usual
90M / 5M / 5M split of the 100,000,000-byte file. Any other size is refused, since results on
another file would not be enwik8 results.
"""

from __future__ import annotations

import contextlib
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .config import PATH_FORMATS
from .sources import SPLITS, Chunk, CorpusSource
from .textio import BLOCK_BYTES

MEMBER = "enwik8"
STANDARD_BYTES = 100_000_000


def split_bounds(size: int) -> dict[str, tuple[int, int]]:
    """Byte ranges ``[start, end)`` of train / valid / test for a file of ``size`` bytes."""
    train_end = size * 9 // 10
    valid_end = train_end + size // 20
    bounds = [0, train_end, valid_end, size]
    return {split: (bounds[i], bounds[i + 1]) for i, split in enumerate(SPLITS)}


def _expected() -> str:
    return f"expected {PATH_FORMATS['enwik8']}"


class Enwik8Source(CorpusSource):
    """enwik8 from the raw file or from ``enwik8.zip``; chunks are ``bytes``."""

    byte_level = True

    def __init__(self, path: str | Path, max_train_bytes: int | None = None) -> None:
        super().__init__("enwik8", max_train_bytes)
        path = Path(path).expanduser()
        if path.is_dir():
            candidates = [path / MEMBER, path / f"{MEMBER}.zip"]
            path = next((p for p in candidates if p.is_file()), candidates[0])
        if not path.is_file():
            raise FileNotFoundError(f"corpus 'enwik8': {path} does not exist; {_expected()}")
        self.path = path
        self.zipped = path.suffix == ".zip"
        self.size = self._member_size() if self.zipped else path.stat().st_size
        if self.size != STANDARD_BYTES:
            what = f"its member {MEMBER!r} holds" if self.zipped else "it holds"
            raise ValueError(
                f"{path}: {what} {self.size:,} bytes, not the {STANDARD_BYTES:,} of enwik8; "
                f"{_expected()}"
            )
        self.bounds = split_bounds(self.size)

    def _member_size(self) -> int:
        try:
            with zipfile.ZipFile(self.path) as archive:
                return archive.getinfo(MEMBER).file_size
        except zipfile.BadZipFile as err:
            raise ValueError(
                f"{self.path}: not a valid zip archive ({err}); {_expected()}"
            ) from err
        except KeyError as err:
            with zipfile.ZipFile(self.path) as archive:
                names = archive.namelist()[:5]
            raise ValueError(
                f"{self.path}: no member {MEMBER!r} (found {names}); {_expected()}"
            ) from err

    @contextlib.contextmanager
    def _open(self) -> Iterator[BinaryIO]:
        if self.zipped:
            with zipfile.ZipFile(self.path) as archive, archive.open(MEMBER) as fh:
                yield fh
        else:
            with open(self.path, "rb") as fh:
                yield fh

    def files(self) -> list[Path]:
        return [self.path]

    def _read(self, split: str) -> Iterator[Chunk]:
        start, end = self.bounds[split]
        try:
            with self._open() as fh:
                fh.seek(start)
                pos = start
                while pos < end:
                    block = fh.read(min(BLOCK_BYTES, end - pos))
                    if not block:
                        raise ValueError(f"{self.path}: ended at byte {pos} of {self.size}")
                    pos += len(block)
                    yield block
        except (zipfile.BadZipFile, zlib.error, EOFError) as err:
            raise ValueError(f"{self.path}: corrupt zip archive ({err}); {_expected()}") from err
