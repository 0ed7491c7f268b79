import re
from pathlib import Path

import pytest

from attnlab.data import CORPORA, DataConfig
from attnlab.utils.io import default_cache_dir


def test_defaults_validate_and_return_self():
    cfg = DataConfig()
    assert cfg.validate() is cfg
    assert (cfg.corpus, cfg.tokenizer, cfg.vocab_size) == ("shakespeare", "byte", 4096)


def test_built_from_a_yaml_style_dict():
    cfg = DataConfig(**{"corpus": "c4", "path": "/data/c4", "tokenizer": "bpe", "vocab_size": 8192})
    assert cfg.validate().vocab_size == 8192


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"corpus": "enwik9"}, "choose one of"),
        ({"tokenizer": "wordpiece"}, "('byte', 'bpe')"),
        ({"valid_fraction": 0.0}, "data.valid_fraction"),
        ({"test_fraction": 1.0}, "data.test_fraction"),
        ({"test_fraction": True}, "data.test_fraction"),
        ({"valid_fraction": 0.6, "test_fraction": 0.4}, "below 1"),
        ({"tokenizer": "bpe", "vocab_size": 256}, "data.vocab_size"),
        ({"tokenizer": "bpe", "vocab_size": "4096"}, "data.vocab_size"),
        ({"max_train_bytes": 0}, "data.max_train_bytes"),
        ({"max_train_bytes": 1.5}, "data.max_train_bytes"),
        ({"cache_dir": 3}, "data.cache_dir"),
        ({"path": "/some/file.txt"}, "use corpus 'text'"),
    ],
)
def test_bad_values_raise_with_the_field_name(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DataConfig(**changes).validate()


def test_unknown_corpus_lists_every_choice():
    with pytest.raises(ValueError) as err:
        DataConfig(corpus="nope").validate()
    assert all(name in str(err.value) for name in CORPORA)


@pytest.mark.parametrize(
    ("corpus", "expected"),
    [
        ("enwik8", "enwik8.zip"),
        ("wikitext103", "wiki.train.raw"),
        ("c4", "c4-validation"),
        ("pes2o", "valid/"),
        ("text", ".txt"),
    ],
)
def test_missing_path_names_the_corpus_and_format(corpus, expected):
    with pytest.raises(ValueError, match=f"corpus '{corpus}'") as err:
        DataConfig(corpus=corpus).validate()
    assert expected in str(err.value)


def test_enwik8_requires_the_byte_tokenizer():
    with pytest.raises(ValueError, match="byte-level"):
        DataConfig(corpus="enwik8", path="x", tokenizer="bpe").validate()


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "env"))
    assert DataConfig().resolved_cache_dir() == tmp_path / "env"
    assert DataConfig(cache_dir=str(tmp_path / "own")).resolved_cache_dir() == tmp_path / "own"
    monkeypatch.delenv("ATTNLAB_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "attnlab"
