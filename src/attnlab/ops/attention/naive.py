"""Explicit activation(q k^T) v: the reference every attention path is checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.ops.attention.activations import attention_weights
from attnlab.ops.attention.masks import allowed_keys, expand_kv_heads


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool,
    key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    activation: str = "softmax",
    sigmoid_bias: float = 0.0,
) -> Tensor | tuple[Tensor, Tensor]:
    """Dense attention with the full ``[B, H, Tq, Tk]`` score matrix formed explicitly.

    Args:
        q: ``[B, H, Tq, D]``; k: ``[B, Hk, Tk, D]``; v: ``[B, Hk, Tk, Dv]`` (Hk divides H).
        scale: multiplies ``q k^T``.
        causal: bottom-right aligned causal mask (see :func:`allowed_keys`).
        key_padding_mask: ``[B, Tk]`` bool, True = real key.
        score_bias: added to the scaled scores, broadcastable to ``[B, H, Tq, Tk]``.
        activation, sigmoid_bias: the score activation (:mod:`.activations`; the bias is
            sigmoid's).
    Returns:
        ``[B, H, Tq, Dv]`` (and the ``[B, H, Tq, Tk]`` weights when ``return_weights``).
        A query with no allowed key outputs zeros.
    """
    n_heads = q.shape[1]
    k, v = expand_kv_heads(k, n_heads), expand_kv_heads(v, n_heads)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if score_bias is not None:
        scores = scores + score_bias
    mask = allowed_keys(
        q.shape[-2], k.shape[-2], causal=causal, key_padding_mask=key_padding_mask,
        device=q.device,
    )
    weights = attention_weights(scores, mask, activation, sigmoid_bias).to(q.dtype)
    if dropout_p > 0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.matmul(weights, v)
    return (out, weights) if return_weights else out
