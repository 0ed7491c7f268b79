"""Pieces shared by the LSH-attention reference and the chunked fast path."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.ops.attention.masks import expand_kv_heads
from attnlab.ops.lsh_attention.hashing import default_n_buckets, draw_rotations

SELF_LOGIT = -5e4
"""Logit given to a position attending to itself (Reformer convention): with shared QK the
self score would dominate, so self is used only when no other key is allowed (in any round)."""


class LshInputs(NamedTuple):
    """Validated inputs in the compute dtype (at least float32), key/value heads expanded.

    ``q`` ``[B, H, Tq, D]``; ``k`` unit-norm ``[B, H, Tk, D]``; ``v`` ``[B, H, Tk, Dv]``;
    ``rotations`` ``[n_hashes, D, n_buckets // 2]``; ``key_ok`` ``[B, Tk]`` bool (True = real
    key); ``scale`` multiplies ``q . k``. The queries are the last ``Tq`` key positions.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    rotations: Tensor
    key_ok: Tensor
    scale: float


def prepare_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    n_hashes: int,
    bucket_size: int,
    generator_or_rotations: Tensor | torch.Generator | None,
    key_padding_mask: Tensor | None,
    scale: float | None,
) -> LshInputs:
    """Check shapes, upcast, L2-normalise the keys and draw rotations when not given.

    q ``[B, H, Tq, D]`` are the queries of the *last* ``Tq`` of the ``Tk`` key positions;
    k ``[B, Hk, Tk, D]`` and v ``[B, Hv, Tk, Dv]`` may have different head counts, each
    dividing ``H`` (shared QK passes the ``H``-headed queries as keys).
    """
    b, n_heads, t_q, dim = q.shape
    t = k.shape[-2]
    if k.shape[0] != b or k.shape[-1] != dim or v.shape[0] != b or v.shape[2] != t or t_q > t:
        raise ValueError(
            f"inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if bucket_size < 1:
        raise ValueError(f"bucket_size must be positive, got {bucket_size}")
    dt = torch.promote_types(q.dtype, torch.float32)
    if isinstance(generator_or_rotations, Tensor):
        rotations = generator_or_rotations
    else:
        rotations = draw_rotations(
            n_hashes, dim, default_n_buckets(t, bucket_size),
            generator=generator_or_rotations, dtype=dt, device=q.device,
        )
    if rotations.dim() != 3 or rotations.shape[:2] != (n_hashes, dim):
        raise ValueError(
            f"rotations must be [n_hashes, D, n_buckets // 2] = [{n_hashes}, {dim}, *], "
            f"got {tuple(rotations.shape)}"
        )
    if key_padding_mask is None:
        key_padding_mask = torch.ones(b, t, dtype=torch.bool, device=q.device)
    elif key_padding_mask.shape != (b, t):
        raise ValueError(
            f"key_padding_mask must be [{b}, {t}], got {tuple(key_padding_mask.shape)}"
        )
    return LshInputs(
        q=q.to(dt),
        k=expand_kv_heads(F.normalize(k.to(dt), dim=-1), n_heads),
        v=expand_kv_heads(v.to(dt), n_heads),
        rotations=rotations,
        key_ok=key_padding_mask,
        scale=dim**-0.5 if scale is None else scale,
    )


def masked_logits(
    scores: Tensor, q_pos: Tensor, k_pos: Tensor, key_ok: Tensor, causal: bool
) -> Tensor:
    """Apply the LSH-attention masks to broadcastable ``[..., Q, K]`` scores.

    ``q_pos`` ``[..., Q, 1]`` and ``k_pos`` ``[..., 1, K]`` are original positions; ``key_ok``
    (broadcastable to ``[..., Q, K]``) is False for pairs that may not attend (padding, or pairs
    outside the allowed chunks or buckets). Self pairs get :data:`SELF_LOGIT`; disallowed and
    (when causal) future keys get ``-inf``.
    """
    scores = scores.masked_fill(q_pos == k_pos, SELF_LOGIT)
    drop = ~key_ok
    if causal:
        drop = drop | (k_pos > q_pos)
    return scores.masked_fill(drop, float("-inf"))


def softmax_stats(logits: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """``softmax(logits) @ v`` and the row log-sum-exp; an all ``-inf`` row gives 0 and ``-inf``
    (with finite, zero gradients)."""
    top = logits.detach().amax(-1, keepdim=True)
    top = top.masked_fill(~torch.isfinite(top), 0.0)
    p = torch.exp(logits - top)
    total = p.sum(-1, keepdim=True)
    nonempty = total > 0
    total = torch.where(nonempty, total, torch.ones_like(total))
    lse = torch.where(nonempty, torch.log(total) + top, -math.inf).squeeze(-1)
    return (p @ v) / total, lse


def combine_rounds(outs: Tensor, lse: Tensor) -> Tensor:
    """Weight each hash round by its share of the total softmax mass.

    Args:
        outs: ``[B, H, R, T, D]``; lse: ``[B, H, R, T]``.
    Returns:
        ``[B, H, T, D]``: ``sum_r exp(lse_r - logsumexp_r lse) out_r`` (0 where every round is
        empty).
    """
    top = lse.detach().amax(2, keepdim=True)
    top = top.masked_fill(~torch.isfinite(top), 0.0)
    w = torch.exp(lse - top)
    total = w.sum(2, keepdim=True)
    w = w / torch.where(total > 0, total, torch.ones_like(total))
    return (w.unsqueeze(-1) * outs).sum(2)
