"""Dense references for attention restricted to per-row key lists or cells."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.attention.activations import attention_weights
from attnlab.ops.attention.bias import BiasFn, dense_bias
from attnlab.ops.attention.masks import expand_kv_heads
from attnlab.ops.sparse_attention.validation import check_cell_inputs, check_sparse_inputs


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
    mask = index_mask(key_index, key_valid, k.shape[-2])
    return masked_attention(q, k, v, mask, scale=scale, row_scale=row_scale)


def cell_mask(cell_head: Tensor, key_index: Tensor, key_valid: Tensor, n_heads: int,
              t_k: int) -> Tensor:
    """The dense ``[B, H, Tq, Tk]`` bool mask the cells describe (True = attends)."""
    b, t_q, c, w = key_index.shape
    target = torch.where(key_valid, cell_head[..., None] * (t_k + 1) + key_index.long(),
                         n_heads * (t_k + 1))  # invalid slots land in a spare column
    mask = torch.zeros(b, t_q, n_heads * (t_k + 1) + 1, dtype=torch.bool, device=cell_head.device)
    mask.scatter_(-1, target.reshape(b, t_q, c * w), True)
    return mask[..., :-1].view(b, t_q, n_heads, t_k + 1)[..., :t_k].transpose(1, 2)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, *, scale: float,
                     row_scale: Tensor | None, score_bias: Tensor | None = None,
                     activation: str = "softmax", sigmoid_bias: float = 0.0) -> Tensor:
    """Dense attention under a ``[B, H, Tq, Tk]`` bool mask (rows with no key give 0), times
    ``row_scale``, with an additive ``score_bias`` broadcastable to the scores and the score
    ``activation``; the shared reference of the sparse paths. At least float32."""
    n_heads = q.shape[1]
    dt = torch.promote_types(q.dtype, torch.float32)
    k, v = expand_kv_heads(k, n_heads).to(dt), expand_kv_heads(v, n_heads).to(dt)
    scores = (q.to(dt) @ k.transpose(-1, -2)) * scale
    if score_bias is not None:
        scores = scores + score_bias.to(dt)
    out = attention_weights(scores, mask, activation, sigmoid_bias) @ v
    if row_scale is not None:
        out = out * row_scale.to(dt).unsqueeze(-1)
    return out.to(q.dtype)


def cell_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, cell_head: Tensor, key_index: Tensor, key_valid: Tensor,
    *, scale: float, row_scale: Tensor | None = None, score_bias: BiasFn | None = None,
    activation: str = "softmax", sigmoid_bias: float = 0.0,
) -> Tensor:
    """Reference: the cells' dense mask and masked attention (``score_bias`` evaluated over
    every pair). O(Tq * Tk) memory."""
    check_cell_inputs(q, k, v, cell_head, key_index, key_valid, row_scale)
    b, h, t_q, _ = q.shape
    mask = cell_mask(cell_head, key_index, key_valid, h, k.shape[-2])
    bias = None if score_bias is None else dense_bias(
        score_bias, b, h, torch.arange(t_q, device=q.device), k.shape[-2])
    return masked_attention(q, k, v, mask, scale=scale, row_scale=row_scale, score_bias=bias,
                            activation=activation, sigmoid_bias=sigmoid_bias)
