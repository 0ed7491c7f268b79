import functools
import hashlib
import io

import pytest

from attnlab.data.documents import Document, DocumentSource
from attnlab.data.sources import SPLITS, take_bytes


def memory_doc(name: str, text: str, key: str | None = None) -> Document:
    data = text.encode()
    return Document(key or name, name, len(data), functools.partial(io.BytesIO, data))


def collection(docs, valid=0.1, test=0.1, cap=None) -> DocumentSource:
    return DocumentSource("demo", docs, [], "memory", valid, test, cap)


def read(source: DocumentSource, split: str) -> str:
    return "".join(source.read(split))


def test_whole_documents_are_split_disjointly_and_cover_the_collection(text_factory):
    docs = [memory_doc(f"doc{i:02d}", text_factory(i, 60 + i)) for i in range(40)]
    source = collection(docs)
    names = {split: source.documents(split) for split in SPLITS}
    assert all(names.values())
    flat = [n for split in SPLITS for n in names[split]]
    assert sorted(flat) == sorted(d.name for d in docs)  # each document in exactly one split
    for split in SPLITS:
        by_name = {d.name: d for d in docs}
        expected = "".join(by_name[n].open().read().decode() + "\n" for n in names[split])
        assert read(source, split) == expected
    sizes = {split: len(read(source, split).encode()) for split in SPLITS}
    total = sum(sizes.values())
    assert 0.05 < sizes["valid"] / total < 0.15 and 0.05 < sizes["test"] / total < 0.15


def test_split_does_not_depend_on_the_order_documents_are_listed(text_factory):
    docs = [memory_doc(f"doc{i:02d}", text_factory(i, 50)) for i in range(30)]
    forward, backward = collection(docs), collection(docs[::-1])
    for split in SPLITS:
        assert read(forward, split) == read(backward, split)


def test_documents_sharing_a_key_share_a_split(text_factory):
    docs = [
        memory_doc(f"{work}_{ed}", text_factory(w, 80), key=work)
        for w, work in enumerate(f"work{i}" for i in range(20))
        for ed in ("modern", "folio")
    ]
    source = collection(docs)
    for split in SPLITS:
        works = [name.split("_")[0] for name in source.documents(split)]
        assert all(works.count(w) == 2 for w in works)


def test_a_single_document_is_cut_contiguously_on_character_boundaries():
    text = "é" * 500  # 1000 bytes of 2-byte characters: cuts at 800 and 900 bytes
    source = collection([memory_doc("only", text)], valid=0.1, test=0.1)
    parts = [read(source, split) for split in SPLITS]
    assert "".join(parts) == text
    assert [len(p.encode()) for p in parts] == [800, 100, 100]
    odd = collection([memory_doc("odd", text)], valid=0.099, test=0.1)  # 801 is mid-character
    parts = [read(odd, split) for split in SPLITS]
    assert "".join(parts) == text
    assert [len(p.encode()) for p in parts] == [802, 98, 100]


def test_too_few_documents_or_none_raise():
    with pytest.raises(ValueError, match="no documents in memory"):
        collection([])
    with pytest.raises(ValueError, match="too few to fill"):
        collection([memory_doc("a", "x" * 100), memory_doc("b", "y" * 100)])


def test_train_cap_cuts_on_a_character_boundary():
    chunks = ["ab", "cé", "de"]  # é is 2 bytes: a 4-byte cap must not split it
    assert list(take_bytes(chunks, 4)) == ["ab", "c"]
    assert list(take_bytes([b"abc", b"def"], 4)) == [b"abc", b"d"]
    assert list(take_bytes(chunks, None)) == chunks


def test_cap_applies_to_train_only(text_factory):
    docs = [memory_doc(f"doc{i:02d}", text_factory(i, 50)) for i in range(30)]
    full, capped = collection(docs), collection(docs, cap=100)
    assert read(capped, "train") == read(full, "train").encode()[:100].decode()
    assert read(capped, "valid") == read(full, "valid")


def test_a_group_goes_where_it_brings_a_split_closest_to_its_budget():
    small = [memory_doc(f"doc{i:02d}", "x" * 99) for i in range(50)]  # 100 bytes with separator
    first = min(
        (f"huge{i}" for i in range(1000)),
        key=lambda name: hashlib.sha256(name.encode()).hexdigest(),
    )
    assert hashlib.sha256(first.encode()).hexdigest() < min(
        hashlib.sha256(d.key.encode()).hexdigest() for d in small
    )
    huge = memory_doc(first, "y" * 4999)  # visited first, 50% of all bytes
    source = collection([huge, *small], valid=0.05, test=0.05)
    assert source.documents("train")[0] == first  # far over both budgets of 500 bytes
    assert len(source.documents("valid")) == len(source.documents("test")) == 5
