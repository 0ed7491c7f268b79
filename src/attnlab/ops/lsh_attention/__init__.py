"""Reformer LSH attention (shared QK): chunked fast paths (bidirectional sort-and-chunk, strictly
causal per-bucket chunks), dense references and hashing helpers."""

from attnlab.ops.lsh_attention.causal import causal_slot_count, causal_slot_layout
from attnlab.ops.lsh_attention.chunked import lsh_attention
from attnlab.ops.lsh_attention.common import SELF_LOGIT
from attnlab.ops.lsh_attention.hashing import (
    default_n_buckets,
    draw_rotations,
    hash_buckets,
    lsh_order,
)
from attnlab.ops.lsh_attention.naive import (
    causal_pair_mask,
    chunk_pair_mask,
    lsh_attention_naive,
)

__all__ = [
    "SELF_LOGIT",
    "causal_pair_mask",
    "causal_slot_count",
    "causal_slot_layout",
    "chunk_pair_mask",
    "default_n_buckets",
    "draw_rotations",
    "hash_buckets",
    "lsh_attention",
    "lsh_attention_naive",
    "lsh_order",
]
