import gzip
import logging

import numpy as np
import pytest

from attnlab.data import DataConfig, load_corpus, open_source, textio
from attnlab.data.jsonl import shard_split
from attnlab.data.sources import SPLITS


def docs(prefix, n, text_factory, seed=0):
    return [f"{prefix} {i}: " + text_factory(seed + i, 20) for i in range(n)]


def decoded(data, split):
    return data.tokenizer.decode(np.asarray(getattr(data, split)))


def load(corpus, folder, tmp_path, **kw):
    cfg = DataConfig(corpus=corpus, path=str(folder), cache_dir=str(tmp_path / "cache"), **kw)
    return load_corpus(cfg)


def write_c4(folder, jsonl_writer, text_factory, order=(0, 1, 2)):
    train = [docs(f"train shard {k}", 5, text_factory, 10 * k) for k in range(2)]
    valid = docs("validation", 7, text_factory, 100)
    writes = [
        lambda: jsonl_writer(folder / "c4-train.00000-of-01024.json.gz", train[0], {"url": "u"}),
        lambda: jsonl_writer(folder / "c4-train.00001-of-01024.json.gz", train[1]),
        lambda: jsonl_writer(folder / "c4-validation.00000-of-00008.json.gz", valid),
    ]
    for i in order:
        writes[i]()
    return train[0] + train[1], valid


def test_c4_json_gz_shards(tmp_path, jsonl_writer, text_factory):
    train, valid = write_c4(tmp_path / "c4", jsonl_writer, text_factory)
    data = load("c4", tmp_path / "c4", tmp_path)
    assert decoded(data, "train") == "".join(d + "\n" for d in train)
    assert decoded(data, "valid") == "".join(d + "\n" for d in valid[:4])  # first half, rounded up
    assert decoded(data, "test") == "".join(d + "\n" for d in valid[4:])


def test_shard_order_does_not_depend_on_creation_or_listing_order(
    tmp_path, jsonl_writer, text_factory, monkeypatch
):
    write_c4(tmp_path / "a", jsonl_writer, text_factory, order=(0, 1, 2))
    write_c4(tmp_path / "b", jsonl_writer, text_factory, order=(2, 1, 0))
    first = load("c4", tmp_path / "a", tmp_path / "1")
    real_walk = textio.os.walk

    def reversed_walk(root):
        for folder, dirs, names in real_walk(root):
            dirs.reverse()
            yield folder, dirs, names[::-1]

    monkeypatch.setattr(textio.os, "walk", reversed_walk)
    second = load("c4", tmp_path / "b", tmp_path / "2")
    for split in SPLITS:
        assert np.array_equal(getattr(first, split), getattr(second, split))


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".jsonl", ".json.gz"])
def test_pes2o_train_and_valid_folders(tmp_path, jsonl_writer, text_factory, suffix):
    root = tmp_path / "pes2o" / "v2"
    train0 = jsonl_writer(root / "train" / f"00000{suffix}", docs("paper a", 4, text_factory))
    train1 = jsonl_writer(root / "train" / f"00001{suffix}", docs("paper b", 4, text_factory, 9))
    valid = docs("held out", 6, text_factory, 50)
    jsonl_writer(root / "valid" / f"00000{suffix}", valid)
    source = open_source(DataConfig(corpus="pes2o", path=str(tmp_path / "pes2o")))
    assert source.shards["train"] == [train0, train1]
    data = load("pes2o", tmp_path / "pes2o", tmp_path)
    assert decoded(data, "train").startswith("paper a 0: ")
    assert decoded(data, "valid") + decoded(data, "test") == "".join(d + "\n" for d in valid)
    assert decoded(data, "test").startswith("held out 3: ")


def test_shard_names():
    assert shard_split("c4-train.00000-of-01024.json.gz") == "train"
    assert shard_split("c4-validation.00007-of-00008.json.gz") == "valid"
    assert shard_split("valid/part.jsonl.zst") == "valid"
    assert shard_split("retrain_notes.json") is None
    with pytest.raises(ValueError, match="both train and validation"):
        shard_split("train/validation.jsonl")


def test_train_cap_stops_reading_the_stream(tmp_path, jsonl_writer, text_factory):
    folder = tmp_path / "c4"
    jsonl_writer(folder / "c4-train.00000-of-00002.json.gz", docs("first", 50, text_factory))
    broken = folder / "c4-train.00001-of-00002.json.gz"
    broken.write_bytes(gzip.compress(b'{"text": "never read"}\n' * 100)[:-12])
    jsonl_writer(folder / "c4-validation.00000-of-00001.json.gz", docs("v", 4, text_factory))
    capped = load("c4", folder, tmp_path, max_train_bytes=1000)
    assert capped.n_bytes["train"] == 1000
    with pytest.raises(ValueError, match="00001-of-00002.json.gz: corrupt or truncated gzip"):
        load("c4", folder, tmp_path)


def test_record_errors_name_file_and_line(tmp_path, jsonl_writer, text_factory):
    folder = tmp_path / "c4"
    shard = folder / "c4-train.00000-of-00001.json"
    jsonl_writer(folder / "c4-validation.00000-of-00001.json", docs("v", 4, text_factory))
    jsonl_writer(shard, ["fine"])
    shard.write_text(shard.read_text() + "\n" + '{"content": "no text field"}\n')
    with pytest.raises(ValueError, match=r"00001.json:3: JSON line without a string 'text'"):
        load("c4", folder, tmp_path)
    shard.write_text('{"text": "ok"}\n{"text": "cut off\n')
    with pytest.raises(ValueError, match=r"00001.json:2: not a JSON line"):
        load("c4", folder, tmp_path)


def test_folder_errors(tmp_path, jsonl_writer, text_factory, caplog):
    with pytest.raises(FileNotFoundError, match="corpus 'pes2o'.*is not a folder"):
        open_source(DataConfig(corpus="pes2o", path=str(tmp_path / "missing")))
    jsonl_writer(tmp_path / "c4" / "c4-train.00000-of-00001.json.gz", ["a"])
    jsonl_writer(tmp_path / "c4" / "c4-extra.json.gz", ["b"])
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(
            FileNotFoundError, match="no validation shards .* expected a folder of JSON-lines"
        ),
    ):
        open_source(DataConfig(corpus="c4", path=str(tmp_path / "c4")))
    assert "c4-extra.json.gz" in caplog.text


def test_a_single_validation_document_leaves_test_empty(tmp_path, jsonl_writer, text_factory):
    jsonl_writer(tmp_path / "c4" / "c4-train.00000-of-00001.json.gz", docs("t", 3, text_factory))
    jsonl_writer(tmp_path / "c4" / "c4-validation.00000-of-00001.json.gz", ["only one"])
    with pytest.raises(ValueError, match="split 'test' of corpus 'c4' is empty"):
        load("c4", tmp_path / "c4", tmp_path)
