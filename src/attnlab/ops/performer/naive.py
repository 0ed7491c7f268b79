"""Explicit Performer attention: forms ``phi(q) phi(k)^T``; the reference for the fast path."""

from __future__ import annotations

from torch import Tensor

from attnlab.ops.attention.masks import allowed_keys, expand_kv_heads
from attnlab.ops.performer.features import check_kernel, feature_map, safe_ratio, scaled_qk


def performer_attention_naive(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    proj: Tensor,
    *,
    kernel: str = "softmax",
    causal: bool,
    scale: float | None = None,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    """``(phi(q) phi(k)^T * mask) v / rowsum``, with the ``[B, H, Tq, Tk]`` matrix explicit.

    Same contract as :func:`attnlab.ops.performer.performer_attention` (without decoding state);
    keys use the global stabiliser of :func:`softmax_features`, which is exact here because the
    stabiliser cancels in the row normalisation. O(Tq * Tk) memory: tests only.

    Args:
        q: ``[B, H, Tq, D]``; k: ``[B, Hk, Tk, D]``; v: ``[B, Hk, Tk, Dv]``; proj: ``[m, D]``.
        causal: bottom-right aligned lower-triangular mask.
        key_padding_mask: ``[B, Tk]`` bool, True = real key.
    Returns:
        ``[B, H, Tq, Dv]`` in ``q.dtype``; a query with no visible key outputs zeros.
    """
    check_kernel(kernel)
    n_heads = q.shape[1]
    qs, ks = scaled_qk(q, k, scale)
    ks = expand_kv_heads(ks, n_heads)
    vs = expand_kv_heads(v, n_heads).to(qs.dtype)
    valid = None if key_padding_mask is None else key_padding_mask[:, None, :]
    phi_q = feature_map(qs, proj, kernel, is_query=True)
    phi_k = feature_map(ks, proj, kernel, is_query=False, valid=valid)
    weights = phi_q @ phi_k.transpose(-1, -2)
    mask = allowed_keys(
        q.shape[-2], k.shape[-2], causal=causal, key_padding_mask=key_padding_mask,
        device=q.device,
    )
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return safe_ratio(weights @ vs, weights.sum(-1)).to(q.dtype)
