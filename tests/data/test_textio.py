import gzip
import io

import pytest
import zstandard

from attnlab.data import textio
from attnlab.data.textio import char_boundary, iter_lines, iter_text_blocks, walk_files


def test_char_boundary_skips_continuation_bytes():
    data = "aé日b".encode()  # a | c3 a9 | e6 97 a5 | b
    fh = io.BytesIO(data)
    assert [char_boundary(fh, i, len(data)) for i in range(len(data) + 1)] == [
        0,
        1,
        3,
        3,
        6,
        6,
        6,
        7,
    ]


def test_text_blocks_end_on_line_breaks_and_rejoin(monkeypatch, text_factory):
    monkeypatch.setattr(textio, "BLOCK_BYTES", 50)
    text = text_factory(1, 200)
    data = text.encode()
    blocks = list(iter_text_blocks(io.BytesIO(data), 0, len(data), "doc"))
    assert len(blocks) > 5
    assert "".join(blocks) == text
    assert all(block.endswith("\n") for block in blocks)


def test_text_blocks_of_a_byte_range():
    data = b"line one\nline two\nline three\n"
    assert "".join(iter_text_blocks(io.BytesIO(data), 9, 18, "doc")) == "line two\n"


def test_invalid_utf8_names_the_document_and_offset():
    data = b"good\nbad \xff here\n"
    with pytest.raises(
        ValueError, match=r"notes\.txt: not UTF-8 text \(invalid byte at offset 9\)"
    ):
        list(iter_text_blocks(io.BytesIO(data), 0, len(data), "notes.txt"))


LINES = [f'{{"text": "record {i}"}}'.encode() for i in range(300)]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_lines_of_plain_and_compressed_files(tmp_path, suffix):
    raw = b"\n".join(LINES) + b"\n"
    data = {
        ".jsonl": raw,
        ".jsonl.gz": gzip.compress(raw),
        ".jsonl.zst": zstandard.ZstdCompressor().compress(raw),
    }[suffix]
    path = tmp_path / f"shard{suffix}"
    path.write_bytes(data)
    assert list(iter_lines(path)) == LINES


def test_multi_frame_zstd_is_read_across_frames(tmp_path, monkeypatch):
    monkeypatch.setattr(textio, "BLOCK_BYTES", 7)
    compressor = zstandard.ZstdCompressor()
    path = tmp_path / "two.jsonl.zst"
    path.write_bytes(compressor.compress(b"a\nb") + compressor.compress(b"c\nd\n"))
    assert list(iter_lines(path)) == [b"a", b"bc", b"d"]


@pytest.mark.parametrize(
    ("name", "damage", "kind"),
    [
        ("x.jsonl.gz", lambda raw: gzip.compress(raw)[:-30], "gzip"),
        ("x.jsonl.gz", lambda raw: b"not gzip at all", "gzip"),
        ("x.jsonl.zst", lambda raw: zstandard.ZstdCompressor().compress(raw)[:-20], "zstd"),
        ("x.jsonl.zst", lambda raw: b"not zstd at all", "zstd"),
    ],
)
def test_corrupt_or_truncated_compressed_files_raise(tmp_path, name, damage, kind):
    path = tmp_path / name
    path.write_bytes(damage(b"\n".join(LINES * 20)))
    with pytest.raises(
        ValueError, match=f"x.jsonl.* corrupt or truncated {kind}|truncated zstandard"
    ):
        list(iter_lines(path))


def test_walk_files_sorts_by_relative_path_and_prunes(tmp_path):
    for rel in ["b/z.txt", "a.txt", "b/test/skip.txt", "c.md", "b/a.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    found = walk_files(tmp_path, ".txt", frozenset({"test"}))
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a.txt", "b/a.txt", "b/z.txt"]
