"""Dense references for LSH attention: the same allowed pairs, as a full ``[T, T]`` mask.

Each mask is derived directly from its definition (no sorting or slot layout), so the fast
paths are checked against an independent construction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.lsh_attention.common import (
    combine_rounds,
    masked_logits,
    prepare_inputs,
    softmax_stats,
)
from attnlab.ops.lsh_attention.hashing import hash_buckets, lsh_order


def chunk_pair_mask(order: Tensor, bucket_size: int, seq_len: int) -> Tensor:
    """Pairs the chunked algorithm compares, ``[B, H, R, T, T]`` bool.

    ``order`` ``[B, H, R, Tp]`` sorts positions (see :func:`lsh_order`); position ``i`` lies in
    chunk ``rank(i) // bucket_size``, and query ``i`` may see key ``j`` when ``j`` is in the same
    chunk or in the cyclically previous one (no look-back when there is a single chunk).
    """
    rank = order.argsort(dim=-1)[..., :seq_len]
    chunk = rank // bucket_size
    n_chunks = order.shape[-1] // bucket_size
    same = chunk.unsqueeze(-1) == chunk.unsqueeze(-2)
    if n_chunks == 1:
        return same
    previous = (chunk.unsqueeze(-1) - 1) % n_chunks == chunk.unsqueeze(-2)
    return same | previous


def causal_pair_mask(buckets: Tensor, bucket_size: int) -> Tensor:
    """Pairs strictly causal LSH attention allows, ``[B, H, R, T, T]`` bool (query, key).

    ``rank(j)`` counts the earlier positions in ``j``'s bucket; query ``i`` may see key ``j <= i``
    in its own bucket when ``rank(j) // bucket_size >= rank(i) // bucket_size - 1``.

    Args:
        buckets: ``[B, H, R, T]`` bucket ids (see :func:`hash_buckets`).
    """
    t = buckets.shape[-1]
    same = buckets.unsqueeze(-1) == buckets.unsqueeze(-2)
    not_after = torch.ones(t, t, dtype=torch.bool, device=buckets.device).tril()
    rank = (same & not_after.tril(-1)).sum(-1)
    chunk = rank // bucket_size
    return same & not_after & (chunk.unsqueeze(-2) >= chunk.unsqueeze(-1) - 1)


def lsh_attention_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    n_hashes: int,
    bucket_size: int,
    causal: bool,
    generator_or_rotations: Tensor | torch.Generator | None = None,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """LSH attention with each round's full score matrix masked to the allowed pairs.

    Same contract as :func:`attnlab.ops.lsh_attention.lsh_attention` but needs ``Tq == Tk``:
    :func:`chunk_pair_mask` when bidirectional, :func:`causal_pair_mask` when causal; checks
    the fast paths' sorting, chunking, slot layout and un-sorting exactly. O(n_hashes * T^2)
    memory: tests only.
    """
    x = prepare_inputs(
        q, k, v, n_hashes=n_hashes, bucket_size=bucket_size,
        generator_or_rotations=generator_or_rotations, key_padding_mask=key_padding_mask,
        scale=scale,
    )
    t = q.shape[-2]
    if k.shape[-2] != t:
        raise ValueError(f"the LSH reference needs Tq == Tk, got {t} and {k.shape[-2]}")
    if causal:
        pairs = causal_pair_mask(hash_buckets(x.k, x.rotations, x.key_ok), bucket_size)
    else:
        order = lsh_order(x.k, x.rotations, bucket_size, x.key_ok)
        pairs = chunk_pair_mask(order, bucket_size, t)
    allowed = pairs & x.key_ok[:, None, None, None, :]
    pos = torch.arange(t, device=q.device)
    scores = (x.q @ x.k.transpose(-1, -2) * x.scale).unsqueeze(2)
    logits = masked_logits(scores, pos[:, None], pos[None, :], allowed, causal)
    outs, lse = softmax_stats(logits, x.v.unsqueeze(2))
    return combine_rounds(outs, lse).to(q.dtype)
