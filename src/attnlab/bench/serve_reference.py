"""Reference engines beside ``attnlab bench serve``'s models: another program's decoding of the
same model, timed in the same rounds as the others (:class:`DecodeReference`).

:class:`LlamaCpp` is the one a CPU user would serve a GGUF model with: llama.cpp (through
``llama-cpp-python``, the optional extra ``attnlab[llama-cpp]``), dense attention, on the
GGUF file's own quantized weights and a float16 KV cache. It decodes batch 1 only (the
Python binding's ``eval`` runs one sequence). Its cache is filled by a real prefill of random
token ids, once per context length (it cannot start from the random caches the torch models
get; seconds to a minute at 8k on 2 cores), and rewound before each cell, so the dtypes of
a run share it. Its memory lives outside torch's allocator, so its records carry no peak
(``peak_mem_mb: None``) but the bytes of its KV cache (``kv_cache_mb``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from pathlib import Path
from typing import Any, Protocol

import torch

from attnlab.bench.serve_inputs import CacheShape

logger = logging.getLogger(__name__)

LLAMA_CPP = "llama.cpp"
LLAMA_CPP_PACKAGE = "llama-cpp-python"
LLAMA_CPP_MISSING = (f"{LLAMA_CPP_PACKAGE} is not installed (pip install 'attnlab[llama-cpp]'; "
                     "it builds llama.cpp from source, about 10 CPU-minutes)")


class Stepper(Protocol):
    """What ``bench serve`` times: a decoder continuing its own cache."""

    def step(self) -> None:
        """One single-token decoding step continuing the cache."""


class DecodeReference(Protocol):
    """Another engine's decoding, as a row of ``bench serve``: :attr:`name` (its records'
    name), :meth:`check` (before anything runs), :meth:`why_not` (None: it can run this
    cell), :meth:`decoder` and :meth:`shape` (fields added to its records)."""

    name: str

    def check(self, device: torch.device) -> None:
        """``ConfigError`` when it cannot run on ``device`` at all."""

    def why_not(self, batch: int) -> str | None:
        """Why it skips decode cells of ``batch`` rows (None: it runs them)."""

    def decoder(self, seq_len: int, start: int, threads: int) -> Stepper:
        """A decoder whose cache holds ``start`` tokens, to step up to ``seq_len``."""

    def shape(self, seq_len: int) -> dict[str, Any]:
        """What its records at ``seq_len`` add to their shapes: the engine, its version and
        settings."""


def llama_cpp_version() -> str | None:
    """The installed ``llama-cpp-python``'s version (None: not installed)."""
    try:
        return importlib.metadata.version(LLAMA_CPP_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


class LlamaCppDecoder:
    """llama.cpp's context over ``gguf`` with ``n_ctx = seq_len``, prefilled once with
    ``start`` random token ids (``seed``); :meth:`rewind` drops what steps added since."""

    def __init__(self, gguf: Path, seq_len: int, start: int, threads: int, flash_attn: bool,
                 seed: int) -> None:
        llama_cpp = importlib.import_module("llama_cpp")
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=seq_len, n_threads=threads,
                                   n_threads_batch=threads, flash_attn=flash_attn, seed=seed,
                                   verbose=False)
        vocab = self.llm.n_vocab()
        gen = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, vocab, (start + 1,), generator=gen).tolist()
        self.token = prompt.pop()
        logger.info("llama.cpp: prefilling %d tokens of %s", start, gguf.name)
        self.llm.eval(prompt)
        self.start = start
        self.kv_cache_mb = _kv_cache_bytes(self.llm.metadata, seq_len) / 2**20

    def rewind(self) -> None:
        """Back to the ``start`` prefilled tokens (the binding's next ``eval`` drops the rest
        of the cache)."""
        self.llm.n_tokens = self.start

    def step(self) -> None:
        self.llm.eval([self.token])


def _kv_cache_bytes(metadata: dict[str, str], n_ctx: int) -> int:
    """Bytes of a float16 KV cache of ``n_ctx`` tokens for the GGUF ``metadata``'s model."""
    arch = metadata["general.architecture"]

    def value(key: str, default: str | None = None) -> int:
        return int(metadata.get(f"{arch}.{key}", default))

    heads = value("attention.head_count")
    shape = CacheShape(value("block_count"), value("attention.head_count_kv", str(heads)),
                       value("embedding_length") // heads)
    return shape.nbytes(1, n_ctx, torch.float16)


class LlamaCpp:
    """llama.cpp's dense decoding of the GGUF file ``gguf`` (see the module's docstring)."""

    name = LLAMA_CPP

    def __init__(self, gguf: str | os.PathLike[str], *, flash_attn: bool = True,
                 seed: int = 0) -> None:
        self.gguf, self.flash_attn, self.seed = Path(gguf), flash_attn, seed
        self._decoders: dict[tuple[int, int, int], LlamaCppDecoder] = {}

    def check(self, device: torch.device) -> None:
        from attnlab.config import ConfigError

        if device.type != "cpu":
            raise ConfigError(f"the {LLAMA_CPP} row runs on the cpu only, not {device.type}")

    def why_not(self, batch: int) -> str | None:
        if llama_cpp_version() is None:
            return LLAMA_CPP_MISSING
        if batch != 1:
            return f"{LLAMA_CPP} decodes batch 1 only (the binding's eval runs one sequence)"
        return None

    def decoder(self, seq_len: int, start: int, threads: int) -> LlamaCppDecoder:
        key = (seq_len, start, threads)
        if key not in self._decoders:
            self._decoders[key] = LlamaCppDecoder(self.gguf, seq_len, start, threads,
                                                  self.flash_attn, self.seed)
        dec = self._decoders[key]
        dec.rewind()
        return dec

    def shape(self, seq_len: int) -> dict[str, Any]:
        built = [d for (t, _, _), d in self._decoders.items() if t == seq_len]
        return {"engine": f"{LLAMA_CPP_PACKAGE} {llama_cpp_version()}",
                "weights": f"{self.gguf.name} (its own quantization)", "kv_cache": "float16",
                "kv_cache_mb": built[0].kv_cache_mb if built else None,
                "flash_attn": self.flash_attn}
