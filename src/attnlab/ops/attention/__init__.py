"""Dense softmax attention: the explicit reference and the SDPA fast path."""

from attnlab.ops.attention.masks import allowed_keys, expand_kv_heads
from attnlab.ops.attention.naive import softmax_attention
from attnlab.ops.attention.sdpa import sdpa_attention

__all__ = ["allowed_keys", "expand_kv_heads", "sdpa_attention", "softmax_attention"]
