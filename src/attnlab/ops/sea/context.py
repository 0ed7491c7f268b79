"""SEA's cheap "average context" that the sparse attention output is mixed with."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.sea.mask import rank_bins


def causal_mean(
    v: Tensor, key_mask: Tensor | None, t_q: int, prefix: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Mean of the real values at or before each of the last ``t_q`` positions.

    v ``[B, Hk, Tv, Dv]``: every key's value, or with ``prefix`` only those after it;
    key_mask ``[B, Tv]`` (True = real) or None; prefix: (sum ``[B, Hk, Dv]``, count ``[B]``)
    of the real values before ``v`` (a decoding step's carry), or None.
    Returns (means ``[B, Hk, Tq, Dv]`` in at least float32, a row with no real key gets 0;
    (sum, count) over every real value so far, the next step's ``prefix``).
    """
    dt = torch.promote_types(v.dtype, torch.float32)
    v = v.to(dt)
    b, t_v = v.shape[0], v.shape[-2]
    if key_mask is None:
        count = torch.arange(1, t_v + 1, device=v.device, dtype=dt).expand(b, t_v)
    else:
        v = v * key_mask[:, None, :, None]
        count = key_mask.to(dt).cumsum(-1)
    sums = v.cumsum(-2)
    if prefix is not None:
        sums = sums + prefix[0].to(dt).unsqueeze(-2)
        count = count + prefix[1].to(dt).unsqueeze(-1)
    means = sums[..., -t_q:, :] / count[:, None, -t_q:, None].clamp_min(1)
    return means, (sums[..., -1, :], count[:, -1])


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
