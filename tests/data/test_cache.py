import logging

import numpy as np
import pytest

from attnlab.data import DataConfig, load_corpus, load_tokenizer
from attnlab.data import cache as cache_module
from attnlab.data import load as load_module
from attnlab.data.cache import token_dtype
from attnlab.data.sources import SPLITS


@pytest.fixture
def book(tmp_path, text_factory):
    folder = tmp_path / "book"
    folder.mkdir()
    for i in range(20):
        (folder / f"chapter{i:02d}.txt").write_text(text_factory(i, 150), encoding="utf-8")
    return folder


def config(book, tmp_path, **kw):
    return DataConfig(corpus="text", path=str(book), cache_dir=str(tmp_path / "cache"), **kw)


def bins(tmp_path):
    return sorted((tmp_path / "cache").rglob("*.bin"))


def test_second_load_reuses_the_cache(book, tmp_path, caplog, monkeypatch):
    first = load_corpus(config(book, tmp_path))
    stamps = [p.stat().st_mtime_ns for p in bins(tmp_path)]
    assert len(stamps) == 3

    def no_build(*args):
        raise AssertionError("re-tokenised although nothing changed")

    monkeypatch.setattr(cache_module, "build", no_build)
    with caplog.at_level(logging.INFO, logger="attnlab.data"):
        second = load_corpus(config(book, tmp_path))
    assert "reusing cached token streams" in caplog.text
    assert [p.stat().st_mtime_ns for p in bins(tmp_path)] == stamps
    for split in SPLITS:
        assert np.array_equal(first.__dict__[split], second.__dict__[split])
    assert second.n_bytes == first.n_bytes
    assert isinstance(second.train, np.memmap) and second.train.dtype == np.uint16


def test_changed_source_invalidates_the_cache(book, tmp_path):
    before = load_corpus(config(book, tmp_path))
    chapter = sorted(book.glob("*.txt"))[0]
    chapter.write_text(chapter.read_text() + "an added line\n", encoding="utf-8")
    after = load_corpus(config(book, tmp_path))
    assert sum(after.n_bytes.values()) == sum(before.n_bytes.values()) + len("an added line\n")
    assert len(bins(tmp_path)) == 6  # a new fingerprint folder next to the old one


def test_changed_settings_invalidate_the_cache(book, tmp_path):
    base = load_corpus(config(book, tmp_path))
    capped = load_corpus(config(book, tmp_path, max_train_bytes=100))
    assert len(capped.train) == 100 < len(base.train)
    other = load_corpus(config(book, tmp_path, valid_fraction=0.2))
    assert len(other.valid) > len(base.valid)


def test_incomplete_cache_is_rebuilt(book, tmp_path, caplog):
    good = load_corpus(config(book, tmp_path))
    meta = next((tmp_path / "cache").rglob("meta.json"))
    meta.unlink()  # as if killed before the last write
    with caplog.at_level(logging.INFO, logger="attnlab.data"):
        rebuilt = load_corpus(config(book, tmp_path))
    assert "tokenising the train split" in caplog.text and meta.is_file()
    assert np.array_equal(rebuilt.train, good.train)
    train_bin = meta.parent / "train.bin"
    with open(train_bin, "r+b") as fh:
        fh.truncate(10)
    again = load_corpus(config(book, tmp_path))
    assert np.array_equal(again.train, good.train)


def test_bpe_is_trained_once_and_reused(book, tmp_path, caplog, monkeypatch):
    first = load_corpus(config(book, tmp_path, tokenizer="bpe", vocab_size=400))
    assert first.unit == "ppl" and 256 < first.tokenizer.vocab_size <= 400
    assert first.train.max() < first.tokenizer.vocab_size
    text = first.tokenizer.decode(np.asarray(first.valid))
    assert len(text.encode()) == first.n_bytes["valid"]
    assert first.bytes_per_token("valid") == first.n_bytes["valid"] / len(first.valid) > 1.5
    with pytest.raises(ValueError, match="unknown split"):
        first.bytes_per_token("dev")

    def no_training(*args):
        raise AssertionError("trained again")

    monkeypatch.setattr(load_module, "train_bpe", no_training)
    with caplog.at_level(logging.INFO, logger="attnlab.data"):
        second = load_corpus(config(book, tmp_path, tokenizer="bpe", vocab_size=400))
    assert "reusing the BPE tokenizer" in caplog.text
    assert second.tokenizer.identity == first.tokenizer.identity
    assert np.array_equal(second.valid, first.valid)


def test_a_given_tokenizer_is_used_instead_of_training(book, tmp_path, monkeypatch):
    trained = load_corpus(config(book, tmp_path, tokenizer="bpe", vocab_size=350))
    run_dir = tmp_path / "run"
    trained.tokenizer.save(run_dir)
    monkeypatch.setattr(load_module, "train_bpe", lambda *a: pytest.fail("trained"))
    restored = load_tokenizer(run_dir)
    other_cache = DataConfig(corpus="text", path=str(book), cache_dir=str(tmp_path / "elsewhere"))
    data = load_corpus(other_cache, tokenizer=restored)
    assert data.tokenizer is restored and data.unit == "ppl"
    assert np.array_equal(data.test, trained.test)


def test_token_dtype():
    assert token_dtype(256) == np.uint16 and token_dtype(65535) == np.uint16
    assert token_dtype(65536) == np.uint32
