"""A KV cache that grows in place: what a serving system keeps, for both sides of a benchmark.

transformers' ``DynamicCache`` appends each step's keys with ``torch.cat``, which copies the
whole cache of every layer on every decoding step: at 8k tokens and batch 8 on SmolLM2-135M
that is twice the bytes the attention itself reads. Serving systems (paged or reserved KV
memory) write the new keys into place instead. :class:`InPlaceCache` does that: each layer
keeps a buffer with spare room (``capacity`` tokens, doubled when full) and returns views of
its filled part, so a step writes only its own keys.

It is a drop-in ``Cache`` for ``model(..., past_key_values=cache)`` and ``generate``: dense
attention (SDPA reads the strided views in place) and attnlab cores (their decoding states
follow the cache's key tensors, as with ``DynamicCache``) give the same results as with a
``DynamicCache``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer


class InPlaceLayer(DynamicLayer):
    """A ``DynamicLayer`` writing new keys and values into a reserved buffer
    ``[B, Hk, capacity, D]``; ``keys`` / ``values`` are views of its first ``length`` tokens."""

    def __init__(self, capacity: int = 0) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = self._value_buffer = None
        self.length = 0

    def _reserve(self, key_states: Tensor, value_states: Tensor, needed: int) -> None:
        """Make room for ``needed`` tokens (at least double the room, amortised O(1))."""
        buffer = self._key_buffer
        if buffer is not None and buffer.shape[-2] >= needed:
            return
        room = max(needed, self.capacity, 2 * (0 if buffer is None else buffer.shape[-2]))
        new = []
        for old, states in ((self._key_buffer, key_states), (self._value_buffer, value_states)):
            grown = states.new_empty(*states.shape[:-2], room, states.shape[-1])
            if old is not None:
                grown[..., : self.length, :] = old[..., : self.length, :]
            new.append(grown)
        self._key_buffer, self._value_buffer = new

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs
               ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, n = self.length, key_states.shape[-2]
        self._reserve(key_states, value_states, start + n)
        self._key_buffer[..., start:start + n, :] = key_states
        self._value_buffer[..., start:start + n, :] = value_states
        self.length = start + n
        self.keys = self._key_buffer[..., : self.length, :]
        self.values = self._value_buffer[..., : self.length, :]
        return self.keys, self.values

    def reset(self) -> None:
        super().reset()
        self.length = 0

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.is_initialized and tokens_to_remove:
            self.length = self.keys.shape[-2]

    def _rebuilt(self) -> None:
        """After a batch reshuffle, which leaves plain tensors: they become the buffers."""
        self._key_buffer, self._value_buffer = self.keys.contiguous(), self.values.contiguous()
        self.keys, self.values = self._key_buffer, self._value_buffer
        self.length = self.keys.shape[-2]

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.get_seq_length() > 0:
            self._rebuilt()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.get_seq_length() > 0:
            self._rebuilt()


class InPlaceCache(Cache):
    """A cache of :class:`InPlaceLayer` s; ``capacity``: tokens each layer reserves up front
    (e.g. prompt + new tokens, so nothing is ever copied; 0 = grow as needed)."""

    def __init__(self, capacity: int = 0) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        # Cache builds a layer per layer index on first use by calling this with no argument
        super().__init__(layer_class_to_replicate=functools.partial(InPlaceLayer, capacity))
