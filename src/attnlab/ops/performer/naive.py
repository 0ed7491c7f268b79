"""Explicit Performer attention: forms ``phi(q) phi(k)^T``; the reference for the fast path."""

from __future__ import annotations

from torch import Tensor

from attnlab.ops.attention.masks import allowed_keys, expand_kv_heads
from attnlab.ops.performer.features import check_kernel, feature_map, safe_ratio, scaled_qk


def performer_attention_weights(
    q: Tensor,
    k: Tensor,
    proj: Tensor,
    *,
    kernel: str = "softmax",
    causal: bool,
    scale: float | None = None,
    key_padding_mask: Tensor | None = None,
) -> Tensor:
    """The attention matrix a Performer applies implicitly: ``phi(q) phi(k)^T`` masked and
    normalised per row.

    Keys use the global stabiliser of :func:`softmax_features`, which is exact here because
    the stabiliser cancels in the row normalisation.

    Args:
        q: ``[B, H, Tq, D]``; k: ``[B, Hk, Tk, D]``; proj: ``[m, D]``.
        causal: bottom-right aligned lower-triangular mask.
        key_padding_mask: ``[B, Tk]`` bool, True = real key.
    Returns:
        ``[B, H, Tq, Tk]`` in the compute dtype, rows summing to 1 (0 for a query with no
        visible key).
    """
    check_kernel(kernel)
    qs, ks = scaled_qk(q, k, scale)
    ks = expand_kv_heads(ks, q.shape[1])
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
    return safe_ratio(weights, weights.sum(-1))


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
    """``(phi(q) phi(k)^T * mask) v / rowsum``, with the ``[B, H, Tq, Tk]`` matrix explicit
    (:func:`performer_attention_weights`).

    Same contract as :func:`attnlab.ops.performer.performer_attention` (without decoding
    state); v ``[B, Hk, Tk, Dv]``. O(Tq * Tk) memory: tests only.

    Returns:
        ``[B, H, Tq, Dv]`` in ``q.dtype``; a query with no visible key outputs zeros.
    """
    weights = performer_attention_weights(q, k, proj, kernel=kernel, causal=causal,
                                          scale=scale, key_padding_mask=key_padding_mask)
    return (weights @ expand_kv_heads(v, q.shape[1]).to(weights.dtype)).to(q.dtype)
