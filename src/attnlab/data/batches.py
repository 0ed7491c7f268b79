"""Batches of token windows, as pure functions of their arguments (exact resumption by step).

With ``world_size > 1`` the stream is cut into ``world_size`` equal contiguous shards (the
remainder at the end is dropped) and rank ``r`` reads only shard ``r``, so ranks never see
the same tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor


def rank_shard(tokens: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """The contiguous ``1 / world_size`` of ``tokens`` that ``rank`` reads (a view)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    size = len(tokens) // world_size
    return tokens[rank * size : (rank + 1) * size]


def _check_shape(batch_size: int, seq_len: int) -> None:
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")


def _to_tensor(windows: np.ndarray) -> tuple[Tensor, Tensor]:
    """Split windows [B, T + 1] into inputs and next-token targets, int64 [B, T] each."""
    ids = torch.from_numpy(windows.astype(np.int64))
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def batch_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit generator seed that differs for every (seed, step, rank)."""
    digest = hashlib.sha256(f"{seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def random_batch(
    tokens: np.ndarray,
    batch_size: int,
    seq_len: int,
    seed: int,
    step: int,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[Tensor, Tensor]:
    """Windows at random starts of this rank's shard.

    Returns ``(x, y)``, int64 tensors of shape [batch_size, seq_len] with ``y[:, t] ==
    x[:, t + 1]`` inside the stream (y is x shifted by one token). The starts come from a
    ``torch.Generator`` seeded by ``batch_seed(seed, step, rank)``, so a step's batch is the
    same whenever it is drawn.
    """
    _check_shape(batch_size, seq_len)
    shard = rank_shard(tokens, rank, world_size)
    n_starts = len(shard) - seq_len
    if n_starts < 1:
        raise ValueError(
            f"a shard of {len(shard)} tokens (stream of {len(tokens)}, world_size {world_size}) "
            f"is too short for windows of seq_len + 1 = {seq_len + 1} tokens"
        )
    generator = torch.Generator().manual_seed(batch_seed(seed, step, rank))
    starts = torch.randint(0, n_starts, (batch_size,), generator=generator).numpy()
    return _to_tensor(shard[starts[:, None] + np.arange(seq_len + 1)])


class SequentialBatches:
    """Transformer-XL style lanes over a stream (or this rank's shard of it).

    The shard is cut into ``batch_size`` contiguous lanes of equal length; chunk ``i`` holds
    positions ``[i * seq_len, (i + 1) * seq_len)`` of every lane as inputs and the next
    positions as targets, so row ``r`` of chunk ``i + 1`` continues row ``r`` of chunk ``i``.
    Lane tails shorter than a full chunk are not used.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        batch_size: int,
        seq_len: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        _check_shape(batch_size, seq_len)
        shard = rank_shard(tokens, rank, world_size)
        lane_len = len(shard) // batch_size
        self.seq_len = seq_len
        self.n_chunks = max(lane_len - 1, 0) // seq_len
        if self.n_chunks < 1:
            raise ValueError(
                f"a shard of {len(shard)} tokens (stream of {len(tokens)}, world_size "
                f"{world_size}) is too short for {batch_size} lanes of seq_len + 1 = "
                f"{seq_len + 1} tokens"
            )
        self.lanes = shard[: batch_size * lane_len].reshape(batch_size, lane_len)

    def __len__(self) -> int:
        """Chunks per lane."""
        return self.n_chunks

    def get(self, i: int) -> tuple[Tensor, Tensor]:
        """Chunk ``i % len(self)``: int64 inputs and targets, each [batch_size, seq_len]."""
        start = (i % self.n_chunks) * self.seq_len
        return _to_tensor(self.lanes[:, start : start + self.seq_len + 1])

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Every chunk once, in order."""
        return (self.get(i) for i in range(self.n_chunks))
