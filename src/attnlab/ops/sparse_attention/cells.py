"""Exact attention where each query row attends to a few *cells*: runs of keys of one head.

SEA's grouped top-k gives every query row about ``H * k`` keys in total but splits them
unevenly across heads (a head may get none, another many). Padding per-(head, row) key lists
(:func:`attnlab.ops.sparse_attention.sparse_attention`) to the fullest head then wastes most
slots: measured with an untrained estimator at T=4096, H=12, k=64, the fullest head of a
256-row block held 180-390 keys against a mean of 64. Here a row instead lists its cells
``(head, up to W keys)``; only the cell count is padded. Each head's softmax runs over all of
that head's cells in the row (a segmented softmax), so the result is exact attention over the
row's keys, per head.

Computed in query-row chunks; with gradients enabled each chunk is checkpointed, so the
gathered ``[B, rows, C, W, D]`` keys and values of a chunk are recomputed in backward rather
than kept (memory O(chunk), not O(T * C * W)).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnlab.ops import contract
from attnlab.ops.attention.activations import check_activation
from attnlab.ops.attention.bias import BiasFn, DistanceBias
from attnlab.ops.sparse_attention.naive import cell_attention_naive
from attnlab.ops.sparse_attention.validation import check_cell_inputs

SLOTS_PER_CHUNK = 32768
"""Gathered (row, cell, key) triples per chunk: 8 MiB per fp32 K or V buffer at D=64."""


def _weights(scores, valid, head, n_heads, activation, sigmoid_bias):
    """``[B, R, C, W]`` weights of the cells' scores under ``activation``, softmax and
    softmax1 normalised over all cells of a (row, head) (a segmented softmax)."""
    if activation == "sigmoid":
        return torch.sigmoid(scores + sigmoid_bias).masked_fill(~valid, 0.0)
    b, r = scores.shape[:2]
    scores = scores.masked_fill(~valid, float("-inf"))
    head_max = scores.new_full((b, r, n_heads), float("-inf"))
    head_max = head_max.scatter_reduce(-1, head, scores.amax(-1), "amax").detach()
    if activation == "softmax1":  # the shift max(max, 0) keeps exp(-shift) finite
        head_max = head_max.clamp_min(0.0)
    shift = head_max.nan_to_num(neginf=0.0)
    e = torch.exp(scores - shift.gather(-1, head)[..., None]).masked_fill(~valid, 0.0)
    total = e.new_zeros(b, r, n_heads).scatter_add(-1, head, e.sum(-1))
    if activation == "softmax1":
        total = total + torch.exp(-shift)
    return e / total.gather(-1, head).clamp_min(torch.finfo(e.dtype).tiny)[..., None]


def _chunk(q_flat, k_flat, v_flat, q_rows, k_rows, head, valid, row_scale, n_heads, scale,
           activation, sigmoid_bias, score_bias=None, rows=None, key_index=None):
    """One chunk: ``q_rows [B, R, C]`` / ``k_rows [B, R, C, W]`` index the flat q and k/v;
    ``score_bias`` (a :data:`BiasFn`) is evaluated at query indices ``rows [1, R, 1]`` and
    key positions ``key_index [B, R, C, W]``."""
    b, r, c, w = k_rows.shape
    q_c = q_flat.index_select(0, q_rows.reshape(-1)).view(b, r, c, -1)
    k_g = k_flat.index_select(0, k_rows.reshape(-1)).view(b, r, c, w, -1)
    scores = torch.einsum("brcd,brcwd->brcw", q_c, k_g) * scale
    if score_bias is not None:
        batch = torch.arange(b, device=scores.device).view(b, 1, 1, 1)
        scores = scores + score_bias(batch, head[..., None], rows[..., None], key_index)
    p = _weights(scores, valid, head, n_heads, activation, sigmoid_bias)
    if row_scale is not None:
        p = p * row_scale.gather(-1, head)[..., None]
    v_g = v_flat.index_select(0, k_rows.reshape(-1)).view(b, r, c, w, -1)
    out_c = torch.einsum("brcw,brcwd->brcd", p, v_g)
    out = out_c.new_zeros(b, r, n_heads, out_c.shape[-1])
    return out.scatter_add(2, head[..., None].expand_as(out_c), out_c)


def cell_attention(
    q: Tensor, k: Tensor, v: Tensor, cell_head: Tensor, key_index: Tensor, key_valid: Tensor,
    *, scale: float, row_scale: Tensor | None = None, query_chunk: int | None = None,
    score_bias: BiasFn | None = None, activation: str = "softmax", sigmoid_bias: float = 0.0,
) -> Tensor:
    """Exact attention of each query row over its cells' keys, per head.

    ``out[b, h, t] = row_scale[b, h, t] * sum act(scale * q[b, h, t] . k_j + bias) v_j``
    over the keys ``j`` of the row's cells whose head is ``h`` (query head h reads key/value
    head ``h // (H // Hk)``), ``bias = score_bias(b, h, t, j)`` (0 without one), ``act`` the
    score ``activation`` (:mod:`attnlab.ops.attention.activations`) over those keys. A head
    with no cell in a row outputs 0.

    Args:
        q: ``[B, H, Tq, D]``; k: ``[B, Hk, Tk, D]``; v: ``[B, Hk, Tk, Dv]``.
        cell_head: integer ``[B, Tq, C]``, the query head of each cell (padded cells: any head,
            all slots invalid).
        key_index: integer ``[B, Tq, C, W]`` key positions of each cell's slots; precondition:
            no key twice within one (row, head).
        key_valid: bool ``[B, Tq, C, W]``.
        row_scale: ``[B, H, Tq]`` multiplier of the probabilities, or None.
        query_chunk: rows per chunk; None = about :data:`SLOTS_PER_CHUNK` / (B C W) rows.
        score_bias: :data:`~attnlab.ops.attention.bias.BiasFn` over query rows ``0..Tq-1``
            and key positions, evaluated only at the cells' keys; or None.
        activation, sigmoid_bias: ``"softmax"``, ``"softmax1"`` or ``"sigmoid"`` (with its
            bias).
    Returns:
        ``[B, H, Tq, Dv]`` in q's dtype (computed in at least float32).
    """
    check_cell_inputs(q, k, v, cell_head, key_index, key_valid, row_scale)
    check_activation(activation)
    b, h, t_q, d = q.shape
    hk, t_k = k.shape[1], k.shape[2]
    dt = torch.promote_types(q.dtype, torch.float32)
    per_row = max(1, key_index[:, 0].numel())
    chunk = query_chunk or max(1, SLOTS_PER_CHUNK // per_row)
    q_flat = q.to(dt).reshape(b * h * t_q, d)
    k_flat, v_flat = k.to(dt).reshape(b * hk * t_k, d), v.to(dt).reshape(b * hk * t_k, -1)
    batch = torch.arange(b, device=q.device).view(b, 1, 1)
    rows = torch.arange(t_q, device=q.device).view(1, t_q, 1)
    head = cell_head.long()
    q_rows = (batch * h + head) * t_q + rows
    kv_head = (batch * hk + head // (h // hk)) * t_k
    keys = torch.where(key_valid, key_index.long(), 0)
    k_rows = kv_head[..., None] + keys
    scale_rows = None if row_scale is None else row_scale.to(dt).transpose(1, 2)  # [B, Tq, H]
    pieces = []
    for start in range(0, t_q, chunk):
        sl = slice(start, start + chunk)
        args = (q_flat, k_flat, v_flat, q_rows[:, sl], k_rows[:, sl], head[:, sl],
                key_valid[:, sl], None if scale_rows is None else scale_rows[:, sl], h, scale,
                activation, sigmoid_bias,
                *(() if score_bias is None else (score_bias, rows[:, sl], keys[:, sl])))
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or (row_scale is not None and row_scale.requires_grad)):
            pieces.append(checkpoint(_chunk, *args, use_reentrant=False))
        else:
            pieces.append(_chunk(*args))
    return torch.cat(pieces, dim=1).transpose(1, 2).to(q.dtype)


def _example(gen: torch.Generator, *, hk: int = 2, t: int = 20, cells: int = 3, width: int = 4,
             row_scale: bool = True, biased: bool = False, activation: str = "softmax"
             ) -> contract.Example:
    """Batch 2, 4 query heads; per row ``cells`` cells on random heads, each a run of up to
    ``width`` keys (the runs of a row never overlap), row 3 with no valid key; ``biased``:
    a distance penalty per head."""
    b, h = 2, 4
    qkv = contract.attention_inputs(gen, b=b, h=h, hk=hk, t_q=t, t_k=t)
    head = torch.randint(0, h, (b, t, cells), generator=gen)
    start = torch.arange(cells) * width + torch.randint(0, t, (b, t, 1), generator=gen)
    valid = torch.rand(b, t, cells, width, generator=gen) < 0.8
    valid[:, min(3, t - 1)] = False
    positions = torch.arange(t, dtype=torch.float64)
    return contract.Example(
        {**qkv, "cell_head": head, "key_index": (start[..., None] + torch.arange(width)) % t,
         "key_valid": valid, "scale": 0.3, "activation": activation, "sigmoid_bias": -1.5,
         "row_scale": torch.rand(b, h, t, generator=gen, dtype=torch.float64)
         if row_scale else None,
         "score_bias": DistanceBias(torch.rand(h, generator=gen, dtype=torch.float64),
                                    positions, positions) if biased else None},
        contract.attention_shape(qkv), options={"query_chunk": 6})


contract.register(contract.OpContract(
    "cell_attention", cell_attention, cell_attention_naive, _example,
    cases=(
        *contract.grid(hk=(4, 2, 1), row_scale=(True, False)),
        *contract.grid(activation=("softmax1", "sigmoid"), biased=(False, True)),
        contract.Case("biased", {"biased": True}),
        contract.Case("one-query-one-key", {"t": 1, "cells": 1, "width": 1}),
    ),
    grads=("q", "k", "v", "row_scale"),
    low_precision=contract.FLOAT32_BFLOAT16,
))
