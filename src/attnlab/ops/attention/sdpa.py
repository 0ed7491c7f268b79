"""``torch.nn.functional.scaled_dot_product_attention``: the FlashAttention-class dense path."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attnlab.ops.attention.masks import allowed_keys


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool,
    key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Same contract as :func:`attnlab.ops.attention.softmax_attention`, through PyTorch SDPA.

    Uses ``is_causal=True`` (the memory-efficient kernels) when there is no cache offset, no
    padding and no bias; otherwise passes an explicit mask or additive bias.
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    gqa = k.shape[1] != q.shape[1]
    if score_bias is None and key_padding_mask is None and (not causal or t_q == t_k):
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, dropout_p=dropout_p, enable_gqa=gqa
        )
    mask = allowed_keys(t_q, t_k, causal=causal, key_padding_mask=key_padding_mask, device=q.device)
    empty_rows = None
    if mask is not None:
        empty_rows = ~mask.any(-1, keepdim=True)
        mask = mask | empty_rows  # keep SDPA finite; those rows are zeroed below
    if score_bias is not None:
        attn_mask = score_bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
    else:
        attn_mask = mask
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, scale=scale, dropout_p=dropout_p, enable_gqa=gqa
    )
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return out
