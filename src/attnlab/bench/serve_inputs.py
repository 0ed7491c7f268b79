"""The inputs of ``attnlab bench serve`` and the checks of its sizes: dtypes,
left-padded prompts and masks, and random KV caches of a model's shape."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import transformers
from torch import Tensor

from attnlab.config import ConfigError, PartSpec
from attnlab.hf.cache import InPlaceCache
from attnlab.utils.provenance import check_threads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CUDA_ONLY_DTYPES = ("float16",)
PAD_DIVISOR = 8
"""The most padded row of a batch has ``T // PAD_DIVISOR`` pad tokens."""
NO_RANDOM_CACHE = {"reformer": "it shares queries and keys, so it cannot decode from cached "
                               "keys it did not compute itself"}
"""Cores that cannot start decoding from a cache they did not fill (why)."""

# ---------------------------------------------------------------- validation


def resolve_dtypes(names: Sequence[str], device: torch.device) -> list[torch.dtype]:
    """The torch dtypes of ``names`` (distinct, in order); ``ValueError`` for an unknown name,
    none at all, or ``float16`` off CUDA."""
    valid = [n for n in DTYPES if device.type == "cuda" or n not in CUDA_ONLY_DTYPES]
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError(f"give one or more dtypes; valid: {', '.join(valid)}")
    for name in names:
        if name not in valid:
            only = " (float16 only on cuda)" if name in CUDA_ONLY_DTYPES else ""
            raise ValueError(f"dtype {name!r} is not valid on {device.type}{only}; valid: "
                             f"{', '.join(valid)}")
    return [DTYPES[n] for n in names]


def _positive(name: str, values: Sequence[int], *, allow_empty: bool = False,
              hint: str = "") -> list[int]:
    """``values`` distinct and ascending; ``ValueError`` unless all are >= 1."""
    if (not values and not allow_empty) or any(v < 1 for v in values):
        raise ValueError(f"{name} must be positive integers, got {list(values)}{hint}")
    return sorted(set(values))


def decode_steps(steps: int, warmup: int, reps: int) -> int:
    """Single-token steps a decode cell runs per model: warmup, one memory step, timed."""
    return warmup + 1 + reps * steps


def check_decode_length(seq_len: int, steps: int, warmup: int, reps: int) -> None:
    """``ValueError`` when ``seq_len`` is too short to hold a left-padded random cache and
    the decode steps after it (every row needs a real cached key before decoding)."""
    n = decode_steps(steps, warmup, reps)
    if seq_len - n <= seq_len // PAD_DIVISOR:
        shortest = next(t for t in range(n + 1, 2 * n + PAD_DIVISOR + 2)
                        if t - n > t // PAD_DIVISOR)
        raise ValueError(
            f"seq_len {seq_len} is too short to decode {n} steps ({warmup} warmup + 1 memory + "
            f"{reps}x{steps} timed) after a left-padded cache: the shortest is {shortest}")


def check_cores(specs: Sequence[PartSpec]) -> None:
    """``ConfigError`` for a core that cannot decode from a random cache."""
    for spec in specs:
        if spec.name in NO_RANDOM_CACHE:
            raise ConfigError(f"core {spec.name!r} cannot be served by this benchmark: "
                              f"{NO_RANDOM_CACHE[spec.name]}")


# ---------------------------------------------------------------- inputs


def pad_lengths(batch: int, seq_len: int) -> list[int]:
    """Left pad tokens per row: ``(seq_len // PAD_DIVISOR) * i // (batch - 1)`` for row ``i``
    (0 for the first row, ``seq_len // PAD_DIVISOR`` for the last; none at batch 1)."""
    if batch == 1:
        return [0]
    return [(seq_len // PAD_DIVISOR) * i // (batch - 1) for i in range(batch)]


def left_padding_mask(pads: Sequence[int], length: int,
                      device: torch.device | str = "cpu") -> Tensor:
    """``[B, length]`` int64 attention mask, 0 on each row's first ``pads[i]`` positions."""
    mask = torch.ones(len(pads), length, dtype=torch.long, device=device)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return mask


def positions(mask: Tensor) -> Tensor:
    """``[B, L]`` position ids of a left-padded ``[B, L]`` mask (0 on the pads)."""
    return (mask.cumsum(-1) - 1).clamp_min(0)


def padding_label(batch: int) -> str:
    return "left" if batch > 1 else "none"


@dataclass(frozen=True)
class CacheShape:
    """Per-layer KV shape of a model: ``layers`` x keys and values ``[B, kv_heads, L,
    head_dim]``."""

    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: transformers.PretrainedConfig) -> CacheShape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, head_dim)

    def nbytes(self, batch: int, length: int, dtype: torch.dtype) -> int:
        """Bytes of the filled keys and values of every layer at ``length`` tokens."""
        elem = torch.empty((), dtype=dtype).element_size()
        return batch * self.kv_heads * length * self.head_dim * 2 * elem * self.layers


def random_cache(shape: CacheShape, batch: int, length: int, capacity: int, dtype: torch.dtype,
                 device: torch.device, generator: torch.Generator) -> InPlaceCache:
    """An :class:`InPlaceCache` of ``capacity`` tokens holding ``length`` random keys and
    values ``[batch, kv_heads, length, head_dim]`` per layer."""
    cache = InPlaceCache(capacity=capacity)
    size = (batch, shape.kv_heads, length, shape.head_dim)
    for layer in range(shape.layers):
        keys, values = (torch.randn(size, generator=generator).to(device, dtype)
                        for _ in range(2))
        cache.update(keys, values, layer)
    return cache


@dataclass(frozen=True)
class Grid:
    """The validated sizes of a run; ``steps``, ``warmup``, ``reps`` as in :func:`run`."""

    seq_lens: list[int]
    batches: list[int]
    prefill_batches: list[int]
    dtypes: list[torch.dtype]
    steps: int
    warmup: int
    reps: int

    def cells(self) -> list[tuple[torch.dtype, str, int, int]]:
        """``(dtype, op, batch, seq_len)`` in run order: per dtype, prefills then decodes."""
        return [(dtype, op, batch, t) for dtype in self.dtypes
                for op, batches in (("prefill", self.prefill_batches), ("decode", self.batches))
                for batch in batches for t in self.seq_lens]


def validated_grid(seq_lens: Sequence[int], batches: Sequence[int],
                   prefill_batches: Sequence[int], dtypes: Sequence[str], steps: int,
                   warmup: int, reps: int, threads: int | None, device: torch.device) -> Grid:
    """The :class:`Grid` of a run's sizes; ``ValueError`` naming the first bad one (threads:
    ``threads``, or torch's when None, beyond this machine's cores too)."""
    for name, value in (("steps", steps), ("warmup", warmup), ("reps", reps)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    check_threads(torch.get_num_threads() if threads is None else threads)
    grid = Grid(_positive("seq_lens", seq_lens), _positive("batches", batches),
                _positive("prefill_batches", prefill_batches, allow_empty=True,
                          hint=" (for no prefill give an empty list: --prefill-batches '')"),
                resolve_dtypes(dtypes, device), steps, warmup, reps)
    check_decode_length(grid.seq_lens[0], steps, warmup, reps)
    return grid
