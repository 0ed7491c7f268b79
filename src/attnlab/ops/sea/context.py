"""SEA's cheap "average context" that the sparse attention output is mixed with."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.sea.mask import rank_bins


def causal_mean(v: Tensor, key_mask: Tensor | None, t_q: int) -> Tensor:
    """Mean of the real values at or before each of the last ``t_q`` positions.

    v ``[B, Hk, Tk, Dv]``; key_mask ``[B, Tk]`` (True = real) or None -> ``[B, Hk, Tq, Dv]`` in
    at least float32; a row with no real key gets 0.
    """
    dt = torch.promote_types(v.dtype, torch.float32)
    v = v.to(dt)
    if key_mask is None:
        count = torch.arange(1, v.shape[-2] + 1, device=v.device, dtype=dt)[:, None]
    else:
        v = v * key_mask[:, None, :, None]
        count = key_mask.to(dt).cumsum(-1)[:, None, :, None]
    sums = v.cumsum(-2)
    return (sums / count.clamp_min(1))[..., -t_q:, :]


def estimate_weighted_mean(
    v_by_rank: Tensor, probs: Tensor, lengths: Tensor, query_mask: Tensor | None
) -> Tensor:
    """Bidirectional average context: ``sum_r v_r * mean_t P_est[t, bin(r)]`` per head.

    Not renormalised by bin width (as in SEA). v_by_rank ``[B, H, R, Dv]`` (values ordered by
    rank, R >= every length); probs ``[B, H, T, K]``; lengths ``[B]`` (real keys, the same for
    every row); query_mask ``[B, T]`` (True = real query, the mean is over those) or None.
    Returns ``[B, H, 1, Dv]`` (float32 or wider).
    """
    dt = torch.promote_types(v_by_rank.dtype, torch.float32)
    probs = probs.to(dt)
    if query_mask is None:
        mean_p = probs.mean(-2)
    else:
        w = query_mask.to(dt)[:, None, :, None]
        mean_p = (probs * w).sum(-2) / w.sum(-2).clamp_min(1)
    bins, exists = rank_bins(lengths, v_by_rank.shape[-2], probs.shape[-1])  # [B, R]
    weight = mean_p.gather(-1, bins.unsqueeze(1).expand(-1, probs.shape[1], -1))
    weight = weight * exists.unsqueeze(1)
    return (weight.unsqueeze(-1) * v_by_rank.to(dt)).sum(-2, keepdim=True)
