"""Score activations: what turns a row of attention scores into weights.

* ``softmax``: ``exp(x_j) / sum_i exp(x_i)``.
* ``softmax1``: ``exp(x_j) / (1 + sum_i exp(x_i))`` (softmax with an extra zero logit, so a
  head can attend to nothing; Miller, "Attention is off by one", 2023).
* ``sigmoid``: ``sigmoid(x_j + b)`` for each key on its own, with a bias ``b`` (about
  ``-log(n)`` for ``n`` keys keeps the initial row sums near 1; Ramapuram et al., "Theory,
  analysis, and best practices for sigmoid self-attention", 2024).

Masked keys get weight 0 under every activation, and so does every key of a row with none.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS = ("softmax", "softmax1", "sigmoid")


def check_activation(activation: str) -> None:
    """``ValueError`` unless ``activation`` is one of :data:`ACTIVATIONS`."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown score activation {activation!r}; choose one of {ACTIVATIONS}")


def attention_weights(
    scores: Tensor, mask: Tensor | None, activation: str = "softmax", sigmoid_bias: float = 0.0
) -> Tensor:
    """Weights ``[..., Tq, Tk]`` of ``scores`` (same shape, bias included) under
    ``activation``, computed in at least float32 and returned in the scores' dtype.

    ``mask``: bool, broadcastable to ``scores``, True = may attend (None: all may).
    """
    check_activation(activation)
    wide = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if activation == "sigmoid":
        weights = torch.sigmoid(wide + sigmoid_bias)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
        return weights.to(scores.dtype)
    if mask is not None:
        wide = wide.masked_fill(~mask, float("-inf"))
    if activation == "softmax":
        weights = torch.softmax(wide, dim=-1).nan_to_num(0.0)  # a row with no key: 0
    else:  # softmax1, shifted by max(row max, 0) so that neither term overflows
        shift = wide.amax(-1, keepdim=True).clamp_min(0.0)
        exp = torch.exp(wide - shift)
        weights = exp / (torch.exp(-shift) + exp.sum(-1, keepdim=True))
    return weights.to(scores.dtype)


def share_logits(scores: Tensor, activation: str = "softmax", sigmoid_bias: float = 0.0
                 ) -> Tensor:
    """Logits whose softmax over a row is each key's share of the row's total weight under
    ``activation`` (``weights / weights.sum(-1)``): the scores themselves for ``softmax`` and
    ``softmax1`` (whose weights are softmax's times a per-row factor), ``log sigmoid(x + b)``
    for ``sigmoid``. -inf (a masked key) stays -inf."""
    check_activation(activation)
    return F.logsigmoid(scores + sigmoid_bias) if activation == "sigmoid" else scores
