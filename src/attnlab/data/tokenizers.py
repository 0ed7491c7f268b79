"""Tokenizers with one small interface: raw bytes (bits per character) or byte-level BPE.

Both save to a single ``tokenizer.json`` that ``load_tokenizer`` restores: ``{"type":
"byte"}`` for bytes, the ``tokenizers`` library's own JSON for BPE.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers, trainers

from attnlab.utils.io import atomic_write_text

from .sources import Chunk

TOKENIZER_FILE = "tokenizer.json"

Ids = Sequence[int] | np.ndarray | torch.Tensor


def _id_list(ids: Ids) -> list[int]:
    return ids.tolist() if isinstance(ids, (np.ndarray, torch.Tensor)) else list(ids)


class Tokenizer(ABC):
    """Maps text to integer ids in ``[0, vocab_size)`` and back.

    ``unit`` says how results are reported: ``"bpc"`` (bits per character, i.e. per UTF-8
    byte) for the byte tokenizer, ``"ppl"`` (perplexity per token) for BPE.
    """

    unit: str

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct ids."""

    @property
    @abstractmethod
    def identity(self) -> str:
        """A string that changes whenever the mapping from text to ids could change."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids of ``text``."""

    @abstractmethod
    def encode_batch(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """Ids of the chunks, encoded one by one and concatenated: 1-D unsigned integer array."""

    @abstractmethod
    def decode(self, ids: Ids) -> str:
        """Text of ``ids`` (a list, 1-D array or 1-D tensor); invalid UTF-8 becomes U+FFFD."""

    @abstractmethod
    def to_json(self) -> str:
        """What ``save`` writes to ``tokenizer.json``."""

    def to_tokenizers(self) -> tokenizers.Tokenizer:
        """The same mapping as a ``tokenizers.Tokenizer`` (what a Hugging Face fast tokenizer
        wraps: exported models carry it); by default the ``tokenizers`` JSON of
        :meth:`to_json`."""
        return tokenizers.Tokenizer.from_str(self.to_json())

    def save(self, directory: str | Path) -> Path:
        """Write ``directory/tokenizer.json`` atomically and return its path."""
        path = Path(directory) / TOKENIZER_FILE
        atomic_write_text(path, self.to_json())
        return path


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids: vocabulary 256, no training; also encodes ``bytes`` directly."""

    unit = "bpc"

    @property
    def vocab_size(self) -> int:
        return 256

    @property
    def identity(self) -> str:
        return "byte"

    def encode(self, text: str | bytes) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode("utf-8"))

    def encode_batch(self, chunks: Sequence[Chunk]) -> np.ndarray:
        data = b"".join(c if isinstance(c, bytes) else c.encode("utf-8") for c in chunks)
        return np.frombuffer(data, dtype=np.uint8)

    def decode(self, ids: Ids) -> str:
        return bytes(_id_list(ids)).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"type": "byte", "vocab_size": 256})

    def to_tokenizers(self) -> tokenizers.Tokenizer:
        """Byte-level BPE without merges whose vocabulary maps each byte's byte-level
        character to the byte's value, so ids are the UTF-8 bytes as here."""
        chars = _byte_chars()
        tokenizer = tokenizers.Tokenizer(models.BPE({chars[b]: b for b in range(256)}, []))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                           use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer


class BPETokenizer(Tokenizer):
    """A byte-level BPE ``tokenizers.Tokenizer``; every byte is in the vocabulary."""

    unit = "ppl"

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        self._tokenizer = tokenizer
        canonical = json.dumps(json.loads(tokenizer.to_str()), sort_keys=True)
        self._identity = "bpe-" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()

    @property
    def identity(self) -> str:
        return self._identity

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, chunks: Sequence[Chunk]) -> np.ndarray:
        if any(isinstance(c, bytes) for c in chunks):
            raise TypeError("BPE encodes text; byte-level corpora need the byte tokenizer")
        encodings = self._tokenizer.encode_batch(list(chunks), add_special_tokens=False)
        return np.fromiter((i for enc in encodings for i in enc.ids), dtype=np.uint32)

    def decode(self, ids: Ids) -> str:
        return self._tokenizer.decode(_id_list(ids), skip_special_tokens=False)

    def to_json(self) -> str:
        return self._tokenizer.to_str()


def _byte_chars() -> list[str]:
    """The printable character byte-level BPE stands each byte for: the byte's own character
    for printable Latin-1 bytes, 256 + n for the n-th other byte (the GPT-2 convention
    ``tokenizers``' ByteLevel uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1),
                 *range(0xAE, 0xFF + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train byte-level BPE with ``vocab_size`` ids (256 bytes + merges) on ``texts``.

    Deterministic: the same texts in the same order give the same tokenizer. The result can
    have fewer ids than asked when the text has too few distinct pairs to merge.
    """
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tokenizer)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Restore the tokenizer that ``Tokenizer.save(directory)`` wrote."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {directory} (written by Tokenizer.save)")
    try:
        text = path.read_bytes().decode("utf-8")
        spec = json.loads(text)
    except ValueError as err:  # UnicodeDecodeError is one
        raise ValueError(f"{path}: not JSON ({err})") from err
    if isinstance(spec, dict) and spec.get("type") == "byte":
        return ByteTokenizer()
    model = spec.get("model") if isinstance(spec, dict) else None
    if isinstance(model, dict) and model.get("type") == "BPE":
        try:
            return BPETokenizer(tokenizers.Tokenizer.from_str(text))
        except Exception as err:  # the Rust library raises a bare Exception
            raise ValueError(f"{path}: a damaged BPE model ({err})") from err
    raise ValueError(
        f"{path}: neither {{'type': 'byte'}} nor a tokenizers BPE model; "
        "expected a file written by Tokenizer.save"
    )
