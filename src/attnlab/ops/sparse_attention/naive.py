"""Dense reference for attention restricted to per-row key index lists."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.attention.masks import expand_kv_heads
from attnlab.ops.sparse_attention.validation import check_sparse_inputs


def index_mask(key_index: Tensor, key_valid: Tensor, t_k: int) -> Tensor:
    """Scatter padded index lists ``[B, H, Tq, S]`` into a dense ``[B, H, Tq, Tk]`` bool mask
    (True = the row attends to that key); invalid slots are ignored."""
    dump = torch.where(key_valid, key_index.long(), t_k)  # invalid slots land in a spare column
    mask = torch.zeros(*key_index.shape[:-1], t_k + 1, dtype=torch.bool, device=key_index.device)
    return mask.scatter_(-1, dump, True)[..., :t_k]


def sparse_attention_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_index: Tensor,
    key_valid: Tensor,
    *,
    scale: float,
    row_scale: Tensor | None = None,
) -> Tensor:
    """Masked dense softmax attention with the mask built from index lists. O(Tq * Tk) memory.

    Same contract as :func:`attnlab.ops.sparse_attention.sparse_attention`.
    """
    check_sparse_inputs(q, k, v, key_index, key_valid, row_scale)
    n_heads = q.shape[1]
    dt = torch.promote_types(q.dtype, torch.float32)
    k, v = expand_kv_heads(k, n_heads).to(dt), expand_kv_heads(v, n_heads).to(dt)
    mask = index_mask(key_index, key_valid, k.shape[-2])
    empty = ~mask.any(-1, keepdim=True)
    scores = (q.to(dt) @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0)
    weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    out = weights @ v
    if row_scale is not None:
        out = out * row_scale.to(dt).unsqueeze(-1)
    return out.to(q.dtype)
