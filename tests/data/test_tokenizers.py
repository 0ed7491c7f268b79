import json

import numpy as np
import pytest
import torch

from attnlab.data import BPETokenizer, ByteTokenizer, load_tokenizer, train_bpe

SAMPLE = "To be, or not to be: that is the question. Café naïve 日本 ☃\n\tend"


@pytest.fixture(scope="module")
def corpus_texts():
    words = "the king and the queen of the land spoke to the people of the town".split()
    return [
        " ".join(words[(i * 3) % len(words) :] + words[: (i * 3) % len(words)]) + "\n"
        for i in range(200)
    ]


def test_byte_round_trip_of_text_and_bytes():
    tok = ByteTokenizer()
    ids = tok.encode(SAMPLE)
    assert ids == list(SAMPLE.encode("utf-8")) and max(ids) < tok.vocab_size == 256
    assert tok.encode(SAMPLE.encode()) == ids
    for form in (ids, np.asarray(ids, dtype=np.uint16), torch.tensor(ids)):
        assert tok.decode(form) == SAMPLE
    assert tok.unit == "bpc"
    assert np.array_equal(tok.encode_batch(["ab", b"\xff", "é"]), [97, 98, 255, 0xC3, 0xA9])


def test_byte_decode_replaces_invalid_utf8_and_rejects_big_ids():
    tok = ByteTokenizer()
    assert tok.decode([104, 0xFF, 105]) == "h\ufffdi"
    with pytest.raises(ValueError):
        tok.decode([300])


def test_byte_save_and_load(tmp_path):
    path = ByteTokenizer().save(tmp_path)
    assert json.loads(path.read_text()) == {"type": "byte", "vocab_size": 256}
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)


def test_bpe_is_deterministic_and_round_trips_through_save(tmp_path, corpus_texts):
    first, second = train_bpe(corpus_texts, 300), train_bpe(corpus_texts, 300)
    assert first.identity == second.identity
    assert first.unit == "ppl" and 256 < first.vocab_size <= 300
    ids = first.encode(SAMPLE)
    assert first.decode(ids) == SAMPLE
    assert len(first.encode("the king and the queen")) < len("the king and the queen")
    first.save(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, BPETokenizer)
    assert loaded.identity == first.identity and loaded.vocab_size == first.vocab_size
    assert loaded.encode(SAMPLE) == ids
    batch = loaded.encode_batch(["the king", " and the queen"])
    assert batch.tolist() == first.encode("the king") + first.encode(" and the queen")
    assert train_bpe(["zebra xylophone quartz jackdaw\n"] * 40, 300).identity != first.identity


def test_bpe_refuses_bytes(corpus_texts):
    with pytest.raises(TypeError, match="byte tokenizer"):
        train_bpe(corpus_texts, 280).encode_batch([b"raw"])


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"type": "sentencepiece"}')
    with pytest.raises(ValueError, match="neither"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes(bytes(range(128, 256)))  # binary garbage
    with pytest.raises(ValueError, match=r"tokenizer.json: not JSON \('utf-8' codec"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 3}}')
    with pytest.raises(ValueError, match="tokenizer.json: a damaged BPE model"):
        load_tokenizer(tmp_path)


TRICKY = "Héllo wörld — 你好\n\tx  y \x00\x7f"


def test_tokenizers_form_encodes_and_decodes_as_the_tokenizer():
    """What exported models carry: the same ids and text, for bytes and for BPE."""
    for tokenizer in (ByteTokenizer(), train_bpe([TRICKY * 20, "plain words " * 50], 300)):
        exported = tokenizer.to_tokenizers()
        ids = exported.encode(TRICKY, add_special_tokens=False).ids
        assert ids == tokenizer.encode(TRICKY)
        assert exported.decode(ids) == TRICKY
