"""``load_corpus``: a config in, three memory-mapped token streams and their tokenizer out.

Cache layout under ``DataConfig.resolved_cache_dir()``::

    <corpus>-<16 hex of the corpus fingerprint>/
        source.json            what the fingerprint covers (for people)
        bpe-<vocab_size>/tokenizer.json   the BPE trained on this corpus's train split
        tokens-<...>/          token streams per tokenizer (see ``attnlab.data.cache``)

The corpus fingerprint covers the corpus name, every source file's path, size and mtime, the
split fractions (for corpora split by fraction), ``max_train_bytes`` and ``CACHE_VERSION``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.utils.io import atomic_write_text

from . import cache, corpora
from .config import FRACTION_SPLIT_CORPORA, DataConfig
from .enwik8 import Enwik8Source
from .jsonl import JsonLinesSource
from .sources import SPLITS, CorpusSource
from .tokenizers import TOKENIZER_FILE, ByteTokenizer, Tokenizer, load_tokenizer, train_bpe
from .wikitext import WikiTextSource

logger = logging.getLogger(__name__)

_SOURCES: dict[str, Callable[[DataConfig], CorpusSource]] = {
    "shakespeare": corpora.shakespeare,
    "wiki": corpora.wiki,
    "pystdlib": corpora.pystdlib,
    "text": corpora.text,
    "enwik8": lambda cfg: Enwik8Source(cfg.path, cfg.max_train_bytes),
    "wikitext103": lambda cfg: WikiTextSource(cfg.path, cfg.max_train_bytes),
    "c4": lambda cfg: JsonLinesSource("c4", cfg.path, cfg.max_train_bytes),
    "pes2o": lambda cfg: JsonLinesSource("pes2o", cfg.path, cfg.max_train_bytes),
}


def open_source(cfg: DataConfig) -> CorpusSource:
    """The reader of ``cfg.corpus`` (validates ``cfg`` and checks that the files exist)."""
    cfg.validate()
    return _SOURCES[cfg.corpus](cfg)


def source_description(cfg: DataConfig, source: CorpusSource) -> dict[str, Any]:
    """Everything the cached data depends on, apart from the tokenizer."""
    description: dict[str, Any] = {
        "version": cache.CACHE_VERSION,
        "corpus": cfg.corpus,
        "files": cache.file_stamps(source.files()),
        "max_train_bytes": cfg.max_train_bytes,
    }
    if cfg.corpus in FRACTION_SPLIT_CORPORA:
        description["fractions"] = [cfg.valid_fraction, cfg.test_fraction]
    return description


@dataclass
class TokenizedCorpus:
    """Token streams of the three splits and the tokenizer that made them.

    Attributes:
        train, valid, test: 1-D read-only memmaps of token ids (uint16 or uint32).
        tokenizer: the tokenizer of the ids.
        n_bytes: UTF-8 bytes of raw text per split, so that bits per character can be
            computed from any tokenizer's loss (see ``bytes_per_token``).
    """

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    tokenizer: Tokenizer
    n_bytes: dict[str, int]

    @property
    def unit(self) -> str:
        """``"bpc"`` for the byte tokenizer, ``"ppl"`` for BPE."""
        return self.tokenizer.unit

    def bytes_per_token(self, split: str) -> float:
        """Raw-text bytes per token of ``split``: bpc = nats per token / ln 2 / this."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
        return self.n_bytes[split] / len(getattr(self, split))


def _trained_tokenizer(cfg: DataConfig, source: CorpusSource, corpus_dir: Path) -> Tokenizer:
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    folder = corpus_dir / f"bpe-{cfg.vocab_size}"
    if (folder / TOKENIZER_FILE).is_file():
        logger.info("reusing the BPE tokenizer in %s", folder)
        return load_tokenizer(folder)
    logger.info(
        "training a %d-id BPE tokenizer on the train split of %s", cfg.vocab_size, cfg.corpus
    )
    tokenizer = train_bpe(source.read("train"), cfg.vocab_size)
    tokenizer.save(folder)
    return tokenizer


def load_corpus(cfg: DataConfig, tokenizer: Tokenizer | None = None) -> TokenizedCorpus:
    """Read, split and tokenise ``cfg.corpus``, reusing the cache when nothing changed.

    Args:
        cfg: the data config (validated here).
        tokenizer: use this tokenizer (e.g. one restored from a finished run) instead of
            the one ``cfg.tokenizer`` names; a BPE is then not trained.

    Raises:
        ValueError: bad config, malformed or empty data, or a BPE tokenizer for enwik8.
        FileNotFoundError: missing path, files or package (the message says what to provide).
    """
    source = open_source(cfg)
    if tokenizer is not None and source.byte_level and not isinstance(tokenizer, ByteTokenizer):
        raise ValueError(f"corpus {cfg.corpus!r} is raw bytes and needs the byte tokenizer")
    description = source_description(cfg, source)
    corpus_dir = cfg.resolved_cache_dir() / f"{cfg.corpus}-{cache.fingerprint(description)[:16]}"
    if not (corpus_dir / "source.json").is_file():
        atomic_write_text(corpus_dir / "source.json", json.dumps(description, indent=1))
    if tokenizer is None:
        tokenizer = _trained_tokenizer(cfg, source, corpus_dir)
    folder = cache.tokens_folder(corpus_dir, tokenizer)
    meta = cache.read_meta(folder, tokenizer)
    if meta is None:
        meta = cache.build(folder, source, tokenizer)
    else:
        logger.info("reusing cached token streams in %s", folder)
    splits = cache.open_splits(folder, meta)
    return TokenizedCorpus(
        **{split: splits[split] for split in SPLITS},
        tokenizer=tokenizer,
        n_bytes=dict(meta["bytes"]),
    )
