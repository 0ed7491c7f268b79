"""Low-level streaming readers: UTF-8 text blocks from binary files, lines from compressed files.

Everything here reads in bounded blocks, so files larger than memory can be streamed.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import zstandard

from attnlab.utils.readers import decode_utf8

BLOCK_BYTES = 1 << 20
"""Target size of one block read from disk."""

_UTF8_CONTINUATION = 0b1100_0000


def char_boundary(fh: BinaryIO, offset: int, size: int) -> int:
    """The first UTF-8 character boundary at or after byte ``offset`` of a ``size``-byte file."""
    fh.seek(offset)
    ahead = fh.read(4)
    skip = 0
    while skip < len(ahead) and ahead[skip] & _UTF8_CONTINUATION == 0b1000_0000:
        skip += 1
    return min(offset + skip, size)


def iter_text_blocks(fh: BinaryIO, start: int, end: int, name: str) -> Iterator[str]:
    """Decode bytes ``[start, end)`` of ``fh`` as UTF-8, in blocks of about ``BLOCK_BYTES``.

    Blocks are extended to the next line break so that no character or line is torn apart;
    ``start`` and ``end`` must lie on character boundaries. Raises ``ValueError`` naming
    ``name`` and the byte offset when the bytes are not valid UTF-8.
    """
    fh.seek(start)
    pos = start
    while pos < end:
        block = fh.read(min(BLOCK_BYTES, end - pos))
        if not block:
            return
        if pos + len(block) < end and not block.endswith(b"\n"):
            block += fh.readline(end - pos - len(block))
        text = decode_utf8(block, name, "UTF-8 plain text", offset=pos)
        pos += len(block)
        yield text


def _split_lines(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Re-cut a stream of byte blocks into lines (without their line breaks)."""
    pending: list[bytes] = []
    for block in blocks:
        start = 0
        while (newline := block.find(b"\n", start)) >= 0:
            pending.append(block[start:newline])
            yield b"".join(pending)
            pending = []
            start = newline + 1
        if start < len(block):
            pending.append(block[start:])
    if pending:
        yield b"".join(pending)


def _zstd_blocks(fh: BinaryIO, path: Path) -> Iterator[bytes]:
    """Decompress a (possibly multi-frame) zstandard stream, failing on truncation.

    ``zstandard``'s own stream readers end silently at a truncated frame; a decompression
    object per frame lets us check that the last frame was complete.
    """
    decompressor = zstandard.ZstdDecompressor()
    frame = decompressor.decompressobj()
    in_frame = False
    while compressed := fh.read(BLOCK_BYTES):
        while compressed:
            in_frame = True
            out = frame.decompress(compressed)
            if out:
                yield out
            if not frame.eof:
                break
            compressed = frame.unused_data
            frame = decompressor.decompressobj()
            in_frame = False
    if in_frame:
        raise ValueError(f"{path}: truncated zstandard file (the last frame is incomplete)")


def compression_of(path: Path) -> str:
    """``gzip``, ``zstd`` or ``none``, from the file name's last suffix."""
    return {".gz": "gzip", ".zst": "zstd"}.get(path.suffix, "none")


def iter_lines(path: Path) -> Iterator[bytes]:
    """Stream the lines of a plain, ``.gz`` or ``.zst`` file, without line breaks.

    Raises ``ValueError`` naming the file when it is corrupt or truncated.
    """
    kind = compression_of(path)
    try:
        if kind == "zstd":
            with open(path, "rb") as fh:
                yield from _split_lines(_zstd_blocks(fh, path))
        else:
            opener = gzip.open if kind == "gzip" else open
            with opener(path, "rb") as fh:
                yield from (line.rstrip(b"\n") for line in fh)
    except (EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError) as err:
        raise ValueError(f"{path}: corrupt or truncated {kind} file ({err})") from err


def walk_files(
    root: Path, suffixes: str | tuple[str, ...], excluded_dirs: frozenset[str] = frozenset()
) -> list[Path]:
    """Files under ``root`` whose names end in ``suffixes``, skipping folders named in
    ``excluded_dirs`` (symlinked folders are not followed), sorted by relative path."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in excluded_dirs]
        found.extend(Path(folder) / name for name in names if name.endswith(suffixes))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())
