"""Oracle top-k attention: each query row attends to the keys with its highest true scores.

An evaluation-only upper bound for key selectors such as SEA: with the same budget of keys
per row, no selector can keep more of the attention than the exact top scores do (it still
computes every score, O(Tq * Tk)). Grouping as SEA's ``topk_group``:

* ``"head"``: each head keeps its own ``k`` best keys;
* ``"heads"``: a row's ``H * Tk`` (head, key) cells are ranked jointly and the best
  ``H * k`` kept, so heads with peaked attention give keys to flatter ones.

Then exact softmax over the kept keys. Causal (queries are the last ``Tq`` keys) and key
padding (True = real key) are respected; a row with fewer allowed cells than its budget keeps
them all. :func:`oracle_attention` works in blocks of queries (memory O(block * Tk));
:func:`oracle_attention_naive` is the one-matrix reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.attention.masks import allowed_keys, expand_kv_heads

GROUPS = ("head", "heads")
QUERY_BLOCK = 256


def check_oracle(k: int, group: str) -> None:
    """``ValueError`` unless ``k >= 1`` and ``group`` is one of :data:`GROUPS`."""
    if k < 1:
        raise ValueError(f"k must be >= 1 key, got {k}")
    if group not in GROUPS:
        raise ValueError(f"group must be one of {list(GROUPS)}, got {group!r}")


def _attend_top(scores: Tensor, v: Tensor, k: int, group: str) -> Tensor:
    """scores ``[B, H, Tq', Tk]`` (-inf = not allowed), v ``[B, H, Tk, Dv]`` -> the
    attention over each row's top cells ``[B, H, Tq', Dv]`` (0 for a row with none)."""
    b, h, t_q, t_k = scores.shape
    if group == "heads":
        flat = scores.transpose(1, 2).reshape(b, t_q, h * t_k)
        top = flat.topk(min(h * k, h * t_k), dim=-1).indices
        keep = torch.zeros_like(flat, dtype=torch.bool).scatter_(-1, top, True)
        keep = keep.view(b, t_q, h, t_k).transpose(1, 2)
    else:
        top = scores.topk(min(k, t_k), dim=-1).indices
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    return probs @ v


def _scores(q: Tensor, k: Tensor, allowed: Tensor | None, scale: float,
            bias: Tensor | None) -> Tensor:
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))


def oracle_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, budget: int, group: str = "heads",
    causal: bool = True, key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None,
) -> Tensor:
    """Exact attention over each row's top-``budget`` keys by true score.

    q ``[B, H, Tq, D]`` (the last ``Tq`` of the keys), k, v ``[B, Hk, Tk, D]`` (``Hk``
    divides ``H``), key_padding_mask ``[B, Tk]`` (True = real key) -> ``[B, H, Tq, Dv]``.
    ``budget``: keys per head (``group="heads"``: ``H * budget`` cells per row).
    ``score_bias``: added to the scores before the selection, ``[B or 1, H or 1, Tq, Tk]``.
    """
    check_oracle(budget, group)
    h, t_q, t_k = q.shape[1], q.shape[-2], k.shape[-2]
    k, v = expand_kv_heads(k, h), expand_kv_heads(v, h)
    out = []
    for start in range(0, t_q, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, t_q)
        # keys after the block's last query are never allowed: leave them out
        t_seen = t_k - t_q + stop if causal else t_k
        padding = None if key_padding_mask is None else key_padding_mask[:, :t_seen]
        allowed = allowed_keys(stop - start, t_seen, causal=causal, key_padding_mask=padding,
                               device=q.device)
        bias = None if score_bias is None else score_bias[..., start:stop, :t_seen]
        scores = _scores(q[..., start:stop, :], k[..., :t_seen, :], allowed, scale, bias)
        out.append(_attend_top(scores, v[..., :t_seen, :], budget, group))
    return torch.cat(out, dim=-2)


def oracle_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, budget: int, group: str = "heads",
    causal: bool = True, key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None,
) -> Tensor:
    """Reference of :func:`oracle_attention`: every score in one matrix, the top cells by
    a full sort."""
    check_oracle(budget, group)
    h, t_q, t_k = q.shape[1], q.shape[-2], k.shape[-2]
    k, v = expand_kv_heads(k, h), expand_kv_heads(v, h)
    allowed = allowed_keys(t_q, t_k, causal=causal, key_padding_mask=key_padding_mask,
                           device=q.device)
    scores = _scores(q, k, allowed, scale, score_bias)
    b = scores.shape[0]
    cells = scores.transpose(1, 2).reshape(b, t_q, h * t_k) if group == "heads" else scores
    n_keep = budget * h if group == "heads" else budget
    order = cells.argsort(dim=-1, descending=True, stable=True)
    rank = order.argsort(dim=-1)
    keep = rank < n_keep
    if group == "heads":
        keep = keep.view(b, t_q, h, t_k).transpose(1, 2)
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    return probs @ v
