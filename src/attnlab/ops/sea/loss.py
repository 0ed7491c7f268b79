"""The distillation loss on SEA's compressed estimate (loss (a) of the SEA paper's recipe)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.sea.mask import rank_bins

KL_WEIGHT = 0.1


def upsample_logits(logits: Tensor, lengths: Tensor, n_ranks: int) -> Tensor:
    """Repeat each bin's logit over its keys: ``[B, H, T, K]`` -> ``[B, H, T, n_ranks]``
    (-inf at ranks ``>= L_t``); lengths ``[B, T]``."""
    bins, exists = rank_bins(lengths, n_ranks, logits.shape[-1])
    up = logits.gather(-1, bins.unsqueeze(1).expand(*logits.shape[:3], n_ranks))
    return up.masked_fill(~exists.unsqueeze(1), float("-inf"))


def attention_distill_loss(student_logits: Tensor, target: Tensor,
                           kl_rows: int | None = None) -> Tensor:
    """``0.1 * KL(target || softmax(student_logits)) + MSE(target, softmax(student_logits))``.

    Both ``[..., N]`` over the same keys (-inf logits and zero target where a key is not
    visible). The KL is summed and divided by ``kl_rows`` (None: every row, "batchmean";
    SEA's bidirectional form divides by the real tokens of the batch instead, so the heads'
    KLs add up); the MSE is the elementwise mean. Rows whose target is all zero (no visible
    key) add 0. Computed in float32 or wider.
    """
    dt = torch.promote_types(student_logits.dtype, torch.float32)
    logp = torch.log_softmax(student_logits.to(dt), dim=-1)
    target = target.to(dt)
    seen = target > 0
    kl_terms = torch.where(seen, target * (target.clamp_min(1e-30).log() - logp), 0.0)
    rows = target[..., 0].numel() if kl_rows is None else kl_rows
    kl = kl_terms.sum() / max(1, rows)
    probs = torch.nan_to_num(logp.exp(), nan=0.0)
    mse = (probs - target).square().mean()
    return KL_WEIGHT * kl + mse


def estimate_loss(logits: Tensor, lengths: Tensor, target: Tensor,
                  kl_rows: int | None = None) -> Tensor:
    """Loss (a): the estimate upsampled to every key vs a target attention over ranks.

    logits ``[B, H, T, K]`` (SEA's compressed estimate); lengths ``[B, T]``; target
    ``[B, H, T, R]`` probabilities over each row's key ranks (zero beyond ``L_t``); kl_rows
    as :func:`attention_distill_loss`'s.
    """
    return attention_distill_loss(upsample_logits(logits, lengths, target.shape[-1]), target,
                                  kl_rows)
