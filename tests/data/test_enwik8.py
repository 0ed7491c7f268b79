import zipfile

import numpy as np
import pytest

from attnlab.data import BPETokenizer, DataConfig, enwik8, load_corpus, train_bpe
from attnlab.data.enwik8 import split_bounds

DATA = bytes(np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8))


@pytest.fixture(autouse=True)
def small_standard_size(monkeypatch):
    """The real format at 2,000 bytes: the size check is tested on its own below."""
    monkeypatch.setattr(enwik8, "STANDARD_BYTES", len(DATA))


def load(path, tmp_path, **kw):
    return load_corpus(DataConfig(corpus="enwik8", path=str(path), cache_dir=str(tmp_path), **kw))


def test_standard_size_gives_the_usual_split():
    assert split_bounds(100_000_000) == {
        "train": (0, 90_000_000),
        "valid": (90_000_000, 95_000_000),
        "test": (95_000_000, 100_000_000),
    }


def as_bytes(ids: np.ndarray) -> bytes:
    assert ids.dtype == np.uint16
    return ids.astype(np.uint8).tobytes()


def check(data):
    assert data.unit == "bpc"
    assert as_bytes(data.train) == DATA[:1800]
    assert as_bytes(data.valid) == DATA[1800:1900]
    assert as_bytes(data.test) == DATA[1900:]
    assert data.n_bytes == {"train": 1800, "valid": 100, "test": 100}


def test_raw_file(tmp_path):
    raw = tmp_path / "enwik8"
    raw.write_bytes(DATA)
    check(load(raw, tmp_path / "cache"))
    check(load(tmp_path, tmp_path / "cache2"))  # a folder holding the file also works


def test_zip_archive(tmp_path):
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("enwik8", DATA)
    check(load(archive, tmp_path / "cache"))


def test_train_cap(tmp_path):
    (tmp_path / "enwik8").write_bytes(DATA)
    data = load(tmp_path / "enwik8", tmp_path / "cache", max_train_bytes=123)
    assert as_bytes(data.train) == DATA[:123] and as_bytes(data.test) == DATA[1900:]


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="corpus 'enwik8'.*does not exist; expected"):
        load(tmp_path / "nothing", tmp_path)
    fake = tmp_path / "fake.zip"
    fake.write_bytes(b"this is not a zip")
    with pytest.raises(ValueError, match="not a valid zip archive"):
        load(fake, tmp_path)
    wrong = tmp_path / "wrong.zip"
    with zipfile.ZipFile(wrong, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(ValueError, match=r"no member 'enwik8' \(found \['readme.txt'\]\)"):
        load(wrong, tmp_path)


@pytest.mark.parametrize("size", [0, 10, len(DATA) - 1, len(DATA) + 1])
def test_a_file_of_another_size_is_refused(size, tmp_path):
    raw = tmp_path / "enwik8"
    raw.write_bytes((DATA * 2)[:size])
    with pytest.raises(ValueError, match=rf"{raw}: it holds {size:,} bytes, not the 2,000"):
        load(raw, tmp_path)
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("enwik8", (DATA * 2)[:size])
    with pytest.raises(ValueError, match=rf"its member 'enwik8' holds {size:,} bytes"):
        load(archive, tmp_path)


def test_the_real_size_is_accepted(monkeypatch, tmp_path):
    monkeypatch.undo()  # the shipped size, not the fixture's
    raw = tmp_path / "enwik8"
    with open(raw, "wb") as fh:
        fh.truncate(100_000_000)  # sparse: nothing is written or read
    assert enwik8.Enwik8Source(raw).bounds["test"] == (95_000_000, 100_000_000)


def test_corrupt_zip_member_raises(tmp_path):
    archive = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("enwik8", DATA)
    raw = bytearray(archive.read_bytes())
    raw[raw.index(DATA[:50]) + 10] ^= 0xFF  # flip a stored byte: the CRC check fails
    archive.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="corrupt zip archive"):
        load(archive, tmp_path)


def test_bpe_is_refused_for_raw_bytes(tmp_path):
    (tmp_path / "enwik8").write_bytes(DATA)
    bpe = train_bpe(["some text to merge " * 50], 300)
    assert isinstance(bpe, BPETokenizer)
    with pytest.raises(ValueError, match="needs the byte tokenizer"):
        load_corpus(DataConfig(corpus="enwik8", path=str(tmp_path / "enwik8")), tokenizer=bpe)
