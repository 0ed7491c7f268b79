"""Strictly causal LSH attention: chunks are cut inside each bucket by within-bucket rank.

Why not sort-and-chunk. The bidirectional path sorts positions by (bucket, position) and cuts
the sorted order into fixed chunks, so a *future* token landing in a lower bucket shifts every
later chunk boundary and changes which past keys an earlier query sees. Here the chunks are
defined per bucket instead:

* ``rank(j)``: how many earlier positions share ``j``'s bucket (depends on the past only);
* bucket-chunk of ``j``: ``rank(j) // bucket_size`` within its own bucket;
* query ``i`` attends to key ``j <= i`` of its own bucket whose bucket-chunk is ``i``'s or the
  one before it (so between ``bucket_size`` and ``2 * bucket_size`` of its bucket's most
  recent keys, fewer at the start of a bucket), per hash round; self only as the last resort
  (:data:`SELF_LOGIT`); rounds combined by their log-sum-exp weights as in the bidirectional
  path. Long-range pairs survive: two far-apart positions with few same-bucket tokens
  between them still attend.

Layout. Every bucket's positions are laid out in rank order in *slots*, each bucket padded to a
multiple of ``bucket_size`` slots, so slot-chunk ``c`` holds one bucket-chunk and its queries
attend to slot-chunks ``c - 1`` and ``c``. A query's row of ``2 * bucket_size`` slots therefore
holds the same keys at the same offsets whatever the future tokens are (future keys only fill
masked slots), which makes earlier outputs bitwise independent of later tokens (given a matmul
that computes each output element on its own, as CPU BLAS does). Key padding has a bucket of
its own (see :func:`hash_buckets`). The slot count is bounded statically
(:func:`causal_slot_count`: at most ``T + min(n_buckets + 1, T) * (bucket_size - 1)``, about
``2 T`` for the default bucket count), so cost and memory are linear in ``T``:
``O(n_hashes * T * bucket_size)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.ops.lsh_attention.common import (
    LshInputs,
    combine_rounds,
    masked_logits,
    softmax_stats,
)
from attnlab.ops.lsh_attention.hashing import hash_buckets


def causal_slot_count(seq_len: int, n_buckets: int, bucket_size: int) -> int:
    """Slots the causal layout needs at most: a multiple of ``bucket_size`` that holds every
    bucket padded to whole chunks (only non-empty buckets take space)."""
    slots = seq_len + min(n_buckets, seq_len) * (bucket_size - 1)
    return math.ceil(slots / bucket_size) * bucket_size


def causal_slot_layout(
    buckets: Tensor, n_buckets: int, bucket_size: int
) -> tuple[Tensor, Tensor]:
    """Place every position in its bucket's region, in rank order.

    Args:
        buckets: ``[..., T]`` int64 bucket ids in ``[0, n_buckets)``.
    Returns:
        ``slot_pos`` ``[..., S]``: the position held by each slot, -1 for an empty slot
        (``S = causal_slot_count(T, n_buckets, bucket_size)``); ``slot_of`` ``[..., T]``: the
        slot of each position. Bucket ``b`` owns slots ``[start_b, start_b + n_b)`` (padded to
        whole chunks), and position ``j`` sits at ``start_b + rank(j)``.
    """
    *lead, t = buckets.shape
    device = buckets.device
    counts = torch.zeros(*lead, n_buckets, dtype=torch.long, device=device)
    counts.scatter_add_(-1, buckets, torch.ones_like(buckets))
    padded = (counts + bucket_size - 1) // bucket_size * bucket_size
    first_slot = padded.cumsum(-1) - padded
    first_sorted = counts.cumsum(-1) - counts
    positions = torch.arange(t, device=device).expand_as(buckets)
    order = torch.sort(buckets, dim=-1, stable=True).indices  # by (bucket, position)
    sorted_rank = torch.empty_like(order).scatter_(-1, order, positions)
    rank = sorted_rank - first_sorted.gather(-1, buckets)
    slot_of = first_slot.gather(-1, buckets) + rank
    n_slots = causal_slot_count(t, n_buckets, bucket_size)
    slot_pos = torch.full((*lead, n_slots), -1, dtype=torch.long, device=device)
    return slot_pos.scatter_(-1, slot_of, positions), slot_of


def _take(x: Tensor, index: Tensor) -> Tensor:
    """``x [B, H, R, N, E]`` rows at ``index [B, H, R, M]`` -> ``[B, H, R, M, E]``."""
    return x.gather(3, index.unsqueeze(-1).expand(*index.shape, x.shape[-1]))


def _rows(x: Tensor, index: Tensor) -> Tensor:
    """Rows of ``x [B, H, T, E]`` at ``index [B, H, R, *shape]`` (-1 reads row 0; callers mask
    it) -> ``[B, H, R, *shape, E]``."""
    src = x.unsqueeze(2).expand(-1, -1, index.shape[2], -1, -1)
    return _take(src, index.clamp(min=0).flatten(3)).view(*index.shape, x.shape[-1])


def _attend(
    x: LshInputs, buckets: Tensor, q_pos: Tensor, k_pos: Tensor, q_offset: int
) -> tuple[Tensor, Tensor]:
    """Softmax of each query group over its key window, per round.

    Args:
        buckets: ``[B, H, R, Tk]``.
        q_pos: ``[B, H, R, G, Q]`` query positions (-1: no query); ``k_pos``: ``[B, H, R, G, W]``
            the positions of the keys every query of the group may see (-1: empty slot).
        q_offset: position of ``x.q``'s first row.
    Returns:
        ``softmax @ v`` ``[B, H, R, G, Q, Dv]`` and the log-sum-exp ``[B, H, R, G, Q]``.
    """
    b, n_heads, n_rounds, t_k = buckets.shape
    key_ok = x.key_ok[:, None, None, :].expand(b, n_heads, n_rounds, t_k)

    def at(table: Tensor, pos: Tensor) -> Tensor:  # table [B, H, R, Tk] read at positions
        return table.gather(3, pos.clamp(min=0).flatten(3)).view(pos.shape)

    same_bucket = at(buckets, q_pos).unsqueeze(-1) == at(buckets, k_pos).unsqueeze(-2)
    allowed = same_bucket & (at(key_ok, k_pos) & (k_pos >= 0)).unsqueeze(-2)
    queries = _rows(x.q, torch.where(q_pos >= 0, q_pos - q_offset, -1))
    scores = queries @ _rows(x.k, k_pos).transpose(-1, -2) * x.scale
    logits = masked_logits(
        scores, q_pos.unsqueeze(-1), k_pos.unsqueeze(-2), allowed, causal=True
    )
    return softmax_stats(logits, _rows(x.v, k_pos))


def causal_lsh_attention(x: LshInputs, bucket_size: int) -> Tensor:
    """Strictly causal shared-QK LSH attention (see the module docstring) on prepared inputs.

    ``x.q`` ``[B, H, Tq, D]`` are the queries of the last ``Tq`` of the ``Tk`` key positions.
    With ``Tq == Tk`` (a full pass) every slot-chunk's queries attend to its window at once; with
    fewer queries (decoding with a cache) each query gathers its own window, so a decoding step
    costs ``O(Tk)`` hashing and an ``O(Tk log Tk)`` sort for the layout, plus
    ``O(Tq * bucket_size)`` attention.

    Returns:
        ``[B, H, Tq, Dv]`` in the compute dtype.
    """
    t_q, t_k = x.q.shape[-2], x.k.shape[-2]
    buckets = hash_buckets(x.k, x.rotations, x.key_ok)  # [B, H, R, Tk], padding: n_buckets
    slot_pos, slot_of = causal_slot_layout(buckets, 2 * x.rotations.shape[-1] + 1, bucket_size)
    # window c = slot-chunks c - 1 and c: [B, H, R, n_chunks, 2 * bucket_size]
    windows = F.pad(slot_pos, (bucket_size, 0), value=-1).unfold(-1, 2 * bucket_size, bucket_size)
    if t_q == t_k:
        chunks = slot_pos.view(*windows.shape[:-1], bucket_size)
        out, lse = _attend(x, buckets, chunks, windows, 0)
        out, lse = _take(out.flatten(3, 4), slot_of), lse.flatten(3).gather(3, slot_of)
    else:
        offset = t_k - t_q
        chunk = slot_of[..., offset:] // bucket_size  # [B, H, R, Tq]
        q_pos = torch.arange(offset, t_k, device=chunk.device).expand_as(chunk).unsqueeze(-1)
        out, lse = _attend(x, buckets, q_pos, _take(windows, chunk), offset)
        out, lse = out.squeeze(-2), lse.squeeze(-1)
    return combine_rounds(out, lse)
