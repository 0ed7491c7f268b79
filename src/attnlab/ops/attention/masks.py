"""Which (query, key) pairs may attend: causal structure plus key padding."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor


def allowed_keys(
    t_q: int,
    t_k: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    device: torch.device,
) -> Tensor | None:
    """Boolean mask of allowed pairs, True = may attend, or None when all pairs are allowed.

    Queries are the *last* ``t_q`` of the ``t_k`` key positions (bottom-right alignment, the
    convention for a KV cache or Transformer-XL memory): query ``i`` sits at key position
    ``t_k - t_q + i`` and, when causal, sees keys ``j <= t_k - t_q + i``.

    Args:
        key_padding_mask: ``[B, t_k]`` bool, True = real key, False = padding.
    Returns:
        ``[B or 1, 1, t_q, t_k]`` bool, or None.
    """
    mask = None
    if causal:
        offset = t_k - t_q
        q_pos = torch.arange(t_q, device=device)[:, None] + offset
        mask = (torch.arange(t_k, device=device)[None, :] <= q_pos)[None, None]
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]
        mask = pad if mask is None else mask & pad
    return mask


def expand_kv_heads(x: Tensor, n_heads: int) -> Tensor:
    """Repeat ``[B, Hk, T, D]`` key/value heads to ``[B, n_heads, T, D]`` (grouped-query)."""
    h_kv = x.shape[1]
    if h_kv == n_heads:
        return x
    if n_heads % h_kv:
        raise ValueError(f"{n_heads} query heads are not a multiple of {h_kv} key/value heads")
    return x.repeat_interleave(n_heads // h_kv, dim=1)


def attend_kept(scores: Tensor, v: Tensor, keep: Tensor) -> Tensor:
    """Exact softmax of ``scores`` ``[B, H, Tq, Tk]`` over the ``keep`` cells (bool, same
    shape), times v ``[B, H, Tk, Dv]`` -> ``[B, H, Tq, Dv]``; 0 (and zero gradients, not NaN)
    for a row that keeps nothing."""
    kept_any = keep.any(dim=-1, keepdim=True)
    logits = scores.masked_fill(~keep, float("-inf")).masked_fill(~kept_any, 0.0)
    return (torch.softmax(logits, dim=-1) * kept_any) @ v


def key_ranks(key_padding_mask: Tensor | None, batch: int, t_k: int,
              device: torch.device | None) -> Tensor:
    """``[B, Tk]`` rank of each key among its row's real keys (padding keys get -1), so that
    selections counted by rank do not move with left padding."""
    if key_padding_mask is None:
        return torch.arange(t_k, device=device).expand(batch, t_k)
    counts = key_padding_mask.long().cumsum(-1)
    return torch.where(key_padding_mask, counts - 1, -1)


def key_pages(ranks: Tensor, page: int) -> Tensor:
    """Each key's page of ``page`` real keys from its rank (:func:`key_ranks`), -1 for
    padding; same shape as ``ranks``."""
    return torch.where(ranks >= 0, ranks // page, -1)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, scale: float,
                     bias: Tensor | None = None) -> Tensor:
    """Exact softmax attention of q ``[B, H, Tq, D]`` over the keys ``keep`` (bool,
    broadcastable to ``[B, H, Tq, Tk]``) of k, v ``[B, Hk, Tk, D]``, ``bias`` added to the
    scores -> ``[B, H, Tq, Dv]``; a row with no key outputs 0 (:func:`attend_kept`)."""
    h = q.shape[1]
    scores = (q @ expand_kv_heads(k, h).transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    return attend_kept(scores, expand_kv_heads(v, h), keep)


_RANK_MAP: tuple[weakref.ref, int, Tensor] | None = None


def rank_positions(key_mask: Tensor) -> Tensor:
    """``[B, Tk]``: position of the r-th real key at ``[b, r]`` (padding positions after the
    real ones). The layers of one forward share their mask object, so the last map is kept
    (for that very tensor, unmodified) and the O(Tk log Tk) sort runs once per forward."""
    global _RANK_MAP
    if _RANK_MAP is not None:
        ref, version, positions = _RANK_MAP
        if ref() is key_mask and key_mask._version == version:
            return positions
    positions = torch.argsort((~key_mask).to(torch.uint8), dim=-1, stable=True)
    _RANK_MAP = (weakref.ref(key_mask), key_mask._version, positions)
    return positions
