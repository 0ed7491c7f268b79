"""Angular LSH for Reformer attention: random rotations, bucket ids and the sorted order."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def default_n_buckets(seq_len: int, bucket_size: int) -> int:
    """An even bucket count giving about ``bucket_size`` positions per bucket (at least 2)."""
    return max(2, 2 * math.ceil(seq_len / (2 * bucket_size)))


def draw_rotations(
    n_hashes: int,
    dim: int,
    n_buckets: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Gaussian random rotations ``[n_hashes, dim, n_buckets // 2]`` for angular LSH."""
    if n_hashes < 1 or n_buckets < 2 or n_buckets % 2:
        raise ValueError(
            f"need n_hashes >= 1 and an even n_buckets >= 2, got {n_hashes}, {n_buckets}"
        )
    return torch.randn(
        n_hashes, dim, n_buckets // 2, generator=generator, dtype=dtype, device=device
    )


def hash_buckets(keys: Tensor, rotations: Tensor, key_ok: Tensor | None = None) -> Tensor:
    """Bucket ``argmax([x R, -x R])`` of every position in every round.

    Args:
        keys: ``[B, H, T, D]``. rotations: ``[n_hashes, D, n_buckets // 2]``.
        key_ok: ``[B, T]`` bool, True = real position. Padding positions get the extra bucket
            ``n_buckets``, so they never share a bucket (or move a chunk boundary) with real
            positions: real outputs do not depend on padded tokens at all.
    Returns:
        ``[B, H, n_hashes, T]`` int64 in ``[0, n_buckets)`` (``n_buckets`` for padding).
    """
    rotated = torch.einsum("bhtd,rdn->bhrtn", keys, rotations.to(keys.dtype))
    buckets = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)
    if key_ok is not None:
        buckets = buckets.masked_fill(~key_ok[:, None, None, :], 2 * rotations.shape[-1])
    return buckets


def lsh_order(
    keys: Tensor, rotations: Tensor, bucket_size: int, key_ok: Tensor | None = None
) -> Tensor:
    """Positions sorted by (bucket, position) per round, padded to a multiple of ``bucket_size``.

    The ``Tp - T`` padding positions ``T .. Tp-1`` get a bucket after every real bucket, so
    they fill the tail of the last chunk (after the ``key_ok`` padding, see
    :func:`hash_buckets`).

    Args:
        keys: ``[B, H, T, D]`` (unit norm). rotations: ``[n_hashes, D, n_buckets // 2]``.
        key_ok: ``[B, T]`` bool, True = real position (see :func:`hash_buckets`).
    Returns:
        ``[B, H, n_hashes, Tp]`` int64 positions, ``Tp = ceil(T / bucket_size) * bucket_size``.
    """
    buckets = hash_buckets(keys, rotations, key_ok)
    t = buckets.shape[-1]
    t_pad = math.ceil(t / bucket_size) * bucket_size
    buckets = torch.nn.functional.pad(buckets, (0, t_pad - t), value=2 * rotations.shape[-1])
    positions = torch.arange(t_pad, device=keys.device)
    return (buckets * t_pad + positions).argsort(dim=-1)
