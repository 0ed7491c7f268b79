"""Exact attention on a per-row set of keys (SEA's inner op): gather fast path and reference."""

from attnlab.ops.sparse_attention.gather import sparse_attention
from attnlab.ops.sparse_attention.naive import index_mask, sparse_attention_naive

__all__ = ["index_mask", "sparse_attention", "sparse_attention_naive"]
