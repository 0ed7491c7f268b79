"""SEA's exact attention on the keys it selects: grouped top-k of the ranked compressed cells,
decompression into runs of keys (at most ``cap`` per bin), softmax (or another score
activation) over those keys per head.

:func:`selected_attention` runs it in one native CPU kernel when it can (``group="heads"``,
CPU float32, float64 or bfloat16, no autograd, softmax with no score bias or ALiBi's:
selection and attention per row, nothing materialised) and otherwise as
:func:`~attnlab.ops.sea.select_cell_list` + :func:`~attnlab.ops.sea.cell_runs` +
:func:`~attnlab.ops.sparse_attention.run_attention` over blocks of rows;
:func:`selected_attention_naive` is the dense-mask reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.attention.bias import BiasFn, DistanceBias, dense_bias, offset_queries
from attnlab.ops.sea.mask import bin_edges, cell_runs, select_cell_list
from attnlab.ops.sparse_attention import (
    cell_mask,
    masked_attention,
    native,
    run_attention,
    run_attention_naive,
    run_keys,
)
from attnlab.ops.sparse_attention.executors import executor_for
from attnlab.ops.sparse_attention.runs import native_bias

# Query rows whose cells are selected and attended together on the PyTorch path: the cell
# lists (and the top-k) are padded to the fullest row of a block, so a block must hold rows of
# similar length (causal rows of length 1..K have up to H*K cells of 1 key, long rows few
# cells of up to k keys). A block starting at a row of L visible keys spans
# max(ROW_BLOCK, L // 4) rows, so budgets within a causal block differ by at most 25%.
ROW_BLOCK = 64


def row_blocks(t_q: int, t_k: int, causal: bool) -> list[slice]:
    """Blocks of query rows of similar length (see :data:`ROW_BLOCK`); queries are the last
    ``t_q`` of ``t_k`` keys."""
    blocks, start = [], 0
    while start < t_q:
        visible = t_k - t_q + start + 1 if causal else t_k
        end = min(t_q, start + max(ROW_BLOCK, visible // 4))
        blocks.append(slice(start, end))
        start = end
    return blocks


def selected_attention(
    q: Tensor, k: Tensor, v: Tensor, ranking: Tensor, lengths: Tensor, k_per_head: int, *,
    scale: float, causal: bool, group: str = "heads", row_scale: Tensor | None = None,
    rank_to_pos: Tensor | None = None, dense: bool = False, query_chunk: int | None = None,
    threads: int | None = None, score_bias: BiasFn | None = None, activation: str = "softmax",
    sigmoid_bias: float = 0.0,
) -> Tensor:
    """Attention of each query row over the keys of its selected cells.

    Args:
        q: ``[B, H, Tq, D]``; k, v: ``[B, Hk, Tk, D]`` (queries are the last ``Tq`` keys).
        ranking: ``[B, H, Tq, K]`` what the top-k ranks (the estimate; cells of empty bins
            negative, never picked); lengths: ``[B, Tq]`` keys visible to each row (``L_t``).
        k_per_head: the budget's keys per head, also the cap of keys per bin.
        causal: how the PyTorch path groups rows of similar length.
        group: ``"heads"``, ``"head"`` or ``"batch"`` (see
            :func:`~attnlab.ops.sea.select_cell_list`).
        row_scale: ``[B, H, Tq]`` multiplier of the probabilities, or None.
        rank_to_pos: ``[B, Tk]`` key position of each rank, or None (identity).
        dense: attend through the selection's dense ``[B, H, rows, Tk]`` mask (SEA's training
            simulation; faster on CPU for a few hundred keys, O(T^2) memory).
        query_chunk: rows per gather of the PyTorch sparse path (None = automatic).
        threads: the native kernel's threads (None: torch's), at most one per row.
        score_bias: additive bias over (batch, head, query row ``0..Tq-1``, key position),
            evaluated only at the selected keys (the native kernel takes a
            :class:`~attnlab.ops.attention.bias.DistanceBias`, ALiBi's form, only); or None.
        activation, sigmoid_bias: the score activation over the selected keys
            (:mod:`attnlab.ops.attention.activations`; the native kernel computes ``softmax``).
    Returns:
        ``[B, H, Tq, Dv]``; a head with no selected key outputs 0.
    """
    tensors = [q, k, v, ranking] + ([] if row_scale is None else [row_scale])
    weighting = {"activation": activation, "sigmoid_bias": sigmoid_bias}
    fused = activation == "softmax" and not dense and group == "heads"
    if executor_for("auto", *tensors, biased=not native_bias(score_bias), native_fits=fused,
                    flex_fits=False) == "native":
        return native.select_attention_native(
            q, k, v, ranking, lengths, k_per_head, cap=k_per_head, scale=scale,
            row_scale=row_scale, rank_to_pos=rank_to_pos, threads=threads, distance=score_bias,
        )
    n_bins = ranking.shape[-1]
    # "batch" ranks all rows of a sample together: select once, then attend by blocks
    whole = None if group != "batch" else select_cell_list(ranking, lengths, k_per_head,
                                                           group=group)
    out = []
    for rows in row_blocks(q.shape[-2], k.shape[-2], causal):
        if whole is None:
            head, bins, keep = select_cell_list(ranking[..., rows, :], lengths[:, rows],
                                                k_per_head, group=group)
        else:
            head, bins, keep = (x[:, rows] for x in whole)
        lo, width, count = cell_runs(bins, keep, lengths[:, rows], n_bins, cap=k_per_head)
        scale_rows = None if row_scale is None else row_scale[..., rows]
        if dense:
            mask = _runs_mask(head, lo, width, count, rank_to_pos, q.shape[1], k.shape[-2])
            bias = None if score_bias is None else dense_bias(
                score_bias, q.shape[0], q.shape[1],
                torch.arange(rows.start, rows.stop, device=q.device), k.shape[-2])
            out.append(masked_attention(q[..., rows, :], k, v, mask, scale=scale,
                                        row_scale=scale_rows, score_bias=bias, **weighting))
        else:
            out.append(run_attention(
                q[..., rows, :], k, v, head, lo, count, width, scale=scale,
                row_scale=scale_rows, rank_to_pos=rank_to_pos, query_chunk=query_chunk,
                validate=False,  # runs from cell_runs: in range by construction
                score_bias=None if score_bias is None else offset_queries(score_bias,
                                                                          rows.start),
                **weighting,
            ))
    return torch.cat(out, dim=-2)


def _runs_mask(head: Tensor, lo: Tensor, width: Tensor, count: Tensor,
               rank_to_pos: Tensor | None, n_heads: int, n_keys: int) -> Tensor:
    """The dense ``[B, H, Tq, Tk]`` bool mask of listed runs of keys (True = attended)."""
    key_index, valid = run_keys(lo, width, count, rank_to_pos)
    return cell_mask(head, key_index, valid, n_heads, n_keys)


def attended_keys(
    ranking: Tensor, lengths: Tensor, k_per_head: int, n_keys: int, *, group: str = "heads",
    rank_to_pos: Tensor | None = None,
) -> Tensor:
    """The keys :func:`selected_attention` attends, as a dense bool mask ``[B, H, Tq, Tk]``
    (True = attended; O(Tq * Tk), for inspection). Arguments as in
    :func:`selected_attention`; ``n_keys`` = ``Tk``."""
    head, bins, keep = select_cell_list(ranking, lengths, k_per_head, group=group)
    lo, width, count = cell_runs(bins, keep, lengths, ranking.shape[-1], cap=k_per_head)
    return _runs_mask(head, lo, width, count, rank_to_pos, ranking.shape[1], n_keys)


def selected_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, ranking: Tensor, lengths: Tensor, k_per_head: int, *,
    scale: float, group: str = "heads", row_scale: Tensor | None = None,
    rank_to_pos: Tensor | None = None, score_bias: BiasFn | None = None,
    activation: str = "softmax", sigmoid_bias: float = 0.0,
) -> Tensor:
    """Reference of :func:`selected_attention`: all rows' cells at once and the dense masked
    attention over their keys."""
    head, bins, keep = select_cell_list(ranking, lengths, k_per_head, group=group)
    lo, width, count = cell_runs(bins, keep, lengths, ranking.shape[-1], cap=k_per_head)
    return run_attention_naive(q, k, v, head, lo, count, width, scale=scale,
                               row_scale=row_scale, rank_to_pos=rank_to_pos,
                               score_bias=score_bias, activation=activation,
                               sigmoid_bias=sigmoid_bias)


def _example(gen: torch.Generator, *, group: str = "heads", k_per_head: int = 6, t_q: int = 70,
             t_k: int = 70, n_bins: int = 16, mapped: bool = True, dense: bool = False,
             biased: bool = False, activation: str = "softmax") -> contract.Example:
    """Batch 2, 4 query heads of 2 KV heads, queries the last ``t_q`` keys with causal
    lengths, but row 1's first five see 0, 1, 3, 9 and 15 keys (fewer than the bins); a
    random ranking, empty bins negative; ``mapped``: ranks map to a random permutation of
    the positions; ``biased``: ALiBi's distance penalty."""
    qkv = contract.attention_inputs(gen, t_q=t_q, t_k=t_k)
    lengths = torch.arange(t_k - t_q, t_k).add(1).expand(2, t_q).clone()
    lengths[1, :5] = torch.tensor([0, 1, 3, 9, 15])
    edges = bin_edges(lengths, n_bins)
    empty = (edges[..., 1:] == edges[..., :-1]).unsqueeze(1)
    ranking = torch.rand(2, 4, t_q, n_bins, generator=gen, dtype=torch.float64)
    positions = torch.arange(t_k, dtype=torch.float64)
    return contract.Example(
        {**qkv, "ranking": ranking.masked_fill(empty, -1.0), "lengths": lengths,
         "k_per_head": k_per_head, "scale": 0.3, "group": group, "activation": activation,
         "sigmoid_bias": -2.0,
         "row_scale": torch.rand(2, 4, t_q, generator=gen, dtype=torch.float64),
         "rank_to_pos": torch.stack([torch.randperm(t_k, generator=gen) for _ in range(2)])
         if mapped else None,
         "score_bias": DistanceBias(torch.rand(4, generator=gen, dtype=torch.float64),
                                    positions[-t_q:], positions) if biased else None},
        contract.attention_shape(qkv), options={"causal": True, "dense": dense})


contract.register(contract.OpContract(
    "selected_attention", selected_attention, selected_attention_naive, _example,
    cases=(
        *contract.grid(group=("heads", "head", "batch"), dense=(False, True)),  # 2 blocks of rows
        *contract.grid(activation=("softmax1", "sigmoid"), dense=(False, True)),
        *contract.grid(label="alibi", biased=(True,), dense=(False, True)),
        # sparse, bins capped at k, every key
        *contract.grid(label="long", t_q=(40,), t_k=(300,), k_per_head=(3, 20, 400)),
        contract.Case("unmapped", {"mapped": False}),
    ),
    grads=("q", "k", "v", "row_scale"),
    low_precision=contract.FLOAT32,  # a bfloat16 ranking ties: its top-k is not the reference's
))
