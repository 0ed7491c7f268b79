import numpy as np
import pytest

from attnlab.data import DataConfig, load_corpus
from attnlab.data.sources import SPLITS


def write_layout(folder, layout, text_factory):
    folder.mkdir(parents=True, exist_ok=True)
    texts = {}
    for i, split in enumerate(SPLITS):
        texts[split] = f" = Heading {layout} {split} = \n" + text_factory(i, 300 if i == 0 else 60)
        (folder / f"wiki.{split}.{layout}").write_text(texts[split], encoding="utf-8")
    return texts


def decoded(data, split):
    return data.tokenizer.decode(np.asarray(getattr(data, split)))


def load(folder, tmp_path, **kw):
    cfg = DataConfig(corpus="wikitext103", path=str(folder), cache_dir=str(tmp_path / "c"), **kw)
    return load_corpus(cfg)


@pytest.mark.parametrize("layout", ["raw", "tokens"])
def test_split_files_are_the_splits(tmp_path, text_factory, layout):
    texts = write_layout(tmp_path / "wikitext-103", layout, text_factory)
    data = load(tmp_path / "wikitext-103", tmp_path)
    for split in SPLITS:
        assert decoded(data, split) == texts[split]
        assert data.n_bytes[split] == len(texts[split].encode())


def test_raw_files_win_over_tokens(tmp_path, text_factory):
    write_layout(tmp_path / "w", "tokens", text_factory)
    raw = write_layout(tmp_path / "w", "raw", text_factory)
    assert decoded(load(tmp_path / "w", tmp_path), "valid") == raw["valid"]


def test_train_cap(tmp_path, text_factory):
    texts = write_layout(tmp_path / "w", "raw", text_factory)
    data = load(tmp_path / "w", tmp_path, max_train_bytes=500)
    assert decoded(data, "train") == texts["train"].encode()[:500].decode("utf-8", "ignore")


def test_missing_files_are_named(tmp_path, text_factory):
    write_layout(tmp_path / "w", "raw", text_factory)
    (tmp_path / "w" / "wiki.test.raw").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks \['wiki.test.raw'\]; expected a folder"):
        load(tmp_path / "w", tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load(tmp_path / "w" / "wiki.train.raw", tmp_path)
