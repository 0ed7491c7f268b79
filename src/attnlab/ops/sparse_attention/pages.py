"""The selection of pages of keys, as every page selector hands it to the executors.

A :class:`PageSelection` says, per (batch, KV head, query row), which pages of ``page`` real
keys the row reads (the query heads of a KV group read the same pages), and how far into the
keys each row may read (causality). Pages are counted over key *ranks* (real keys only);
``rank_to_pos`` maps ranks to positions under padding.

Executors: :func:`attend_pages` runs the exact softmax over the selected keys through
:func:`~attnlab.ops.sparse_attention.run_attention` (each page a run of keys: the native CPU
kernel where the inputs allow, the PyTorch gather otherwise; that choice is made there, in
one place); :func:`attend_pages_triton` reads the selection as a block table in one Triton
kernel (a GPU's few rows; no host sync); FlexAttention's is in
:mod:`~attnlab.ops.sparse_attention.flex`. :func:`attend_pages_naive` is the reference: a
dense mask of the same keys.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.attention.masks import (
    expand_kv_heads,
    key_ranks,
    masked_attention,
    rank_positions,
)
from attnlab.ops.sparse_attention.runs import run_attention


@dataclasses.dataclass
class PageSelection:
    """``pages`` ``[B, Hk, Tq, n]`` int64: the pages each row reads per KV head (-1: an
    unused slot; no page twice in a row); ``page``: keys per page; ``limit`` ``[B, Tq]``
    int64: a row reads ranks below it (causal: its own rank + 1; 0 for a padded query);
    ``rank_to_pos`` ``[B, Tk]``: the key position of each rank, or None (rank = position)."""

    pages: Tensor
    page: int
    limit: Tensor
    rank_to_pos: Tensor | None = None


def row_limits(q_ranks: Tensor, n_real: Tensor, causal: bool) -> Tensor:
    """``PageSelection.limit`` ``[B, Tq]``: the ranks below which each row reads, from the
    queries' ranks ``[B, Tq]`` (-1: padded, reads none) and the real keys ``[B]``: its own
    rank + 1 when causal, every real key otherwise."""
    limit = q_ranks + 1 if causal else n_real[:, None].expand_as(q_ranks)
    return limit.masked_fill(q_ranks < 0, 0)


def pages_from_kept(kept: Tensor, n: int) -> Tensor:
    """``[B, Hk, Tq, n]`` page indices (-1: unused) of the pages ``kept`` ``[B, Hk, Tq, P]``
    (bool, at most ``n`` per row), in increasing order."""
    n_all = kept.shape[-1]
    index = torch.arange(n_all, device=kept.device)
    # kept pages first, by index: score a kept page above every unkept one
    order = torch.where(kept, n_all - index, -1 - index)
    slot = order.topk(min(n, n_all), dim=-1).values
    pages = torch.where(slot > 0, n_all - slot, -1)
    if n > n_all:
        pages = torch.nn.functional.pad(pages, (0, n - n_all), value=-1)
    return pages


def page_runs(selection: PageSelection, n_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """The selection as runs for :func:`~attnlab.ops.sparse_attention.run_attention`:
    (head, first rank, keys) int64 ``[B, Tq, H * n]`` (a run's width equals its keys)."""
    pages = selection.pages
    b, h_kv, t_q, n = pages.shape
    per = n_heads // h_kv
    by_head = pages[:, :, None].expand(b, h_kv, per, t_q, n).reshape(b, n_heads, t_q, n)
    lo = by_head.clamp_min(0) * selection.page
    count = (selection.limit[:, None, :, None] - lo).clamp(0, selection.page)
    count = count.masked_fill(by_head < 0, 0)
    head = torch.arange(n_heads, device=pages.device)[None, :, None, None].expand_as(lo)
    return tuple(x.permute(0, 2, 1, 3).reshape(b, t_q, n_heads * n) for x in (head, lo, count))


def attend_pages(q: Tensor, k: Tensor, v: Tensor, selection: PageSelection, *, scale: float
                 ) -> Tensor:
    """Exact softmax of q ``[B, H, Tq, D]`` over its selected keys of k, v ``[B, Hk, Tk, D]``
    -> ``[B, H, Tq, Dv]`` (0 for a row that reads none)."""
    head, lo, count = page_runs(selection, q.shape[1])
    return run_attention(q, k, v, head, lo, count, count, scale=scale,
                         rank_to_pos=selection.rank_to_pos, validate=False)


def attend_pages_triton(q: Tensor, k: Tensor, v: Tensor, selection: PageSelection, *,
                        scale: float) -> Tensor:
    """:func:`attend_pages` by the Triton kernel
    (:mod:`~attnlab.ops.sparse_attention.triton_pages`, imported here at first use: CUDA, or
    CPU under ``TRITON_INTERPRET=1``; no gradients)."""
    from attnlab.ops.sparse_attention.triton_pages import attend_pages_kernel

    return attend_pages_kernel(q, k, v, selection, scale=scale)


def selection_keep(selection: PageSelection, t_k: int) -> Tensor:
    """``[B, Hk, Tq, Tk]`` bool: the key positions each row reads per KV head."""
    pages, page = selection.pages, selection.page
    ranks = torch.arange(t_k, device=pages.device)
    read = ((ranks // page)[None, None, None, :, None] == pages[..., None, :]).any(-1)
    read &= ranks < selection.limit[:, None, :, None]
    if selection.rank_to_pos is None:
        return read
    keep = torch.zeros_like(read)
    at = selection.rank_to_pos[:, None, None, :].expand_as(read)
    return keep.scatter_(-1, at, read)


def attend_pages_naive(q: Tensor, k: Tensor, v: Tensor, selection: PageSelection, *,
                       scale: float) -> Tensor:
    """Reference of :func:`attend_pages`: masked dense attention over the same keys."""
    keep = expand_kv_heads(selection_keep(selection, k.shape[-2]), q.shape[1])
    return masked_attention(q, k, v, keep, scale)


def selection_example(gen: torch.Generator, *, padded: bool = False, causal: bool = True,
             t_q: int = 21, t_k: int = 21, n: int = 3) -> contract.Example:
    """The contract example of the page selections' executors: batch 2, 6 query heads of 2 KV
    heads, pages of 3 keys; each row reads ``n`` random
    distinct pages (about 1 in 5 slots unused); padding: a hole, and left padding."""
    qkv = contract.attention_inputs(gen, h=6, t_q=t_q, t_k=t_k)
    padding = contract.padding_mask(2, t_k) if padded else None
    ranks = key_ranks(padding, 2, t_k, None)
    n_pages = -(-t_k // 3)
    pages = torch.rand(2, 2, t_q, n_pages, generator=gen).topk(min(n, n_pages), -1).indices
    pages = pages.masked_fill(torch.rand(pages.shape, generator=gen) < 0.2, -1)
    q_ranks = ranks[:, -t_q:]
    selection = PageSelection(pages, 3, row_limits(q_ranks, ranks.max(-1).values + 1, causal),
                              None if padding is None else rank_positions(padding))
    return contract.Example({**qkv, "selection": selection, "scale": 0.4},
                            contract.attention_shape(qkv))


contract.register(contract.OpContract(
    "attend_pages", attend_pages, attend_pages_naive, selection_example,
    cases=(
        *contract.grid(padded=(False, True), causal=(True, False)),
        *contract.grid(label="cache", padded=(True,), t_q=(1, 5)),
        *contract.grid(label="one-key", t_q=(1,), t_k=(1,)),
    ),
    low_precision=contract.FLOAT32_BFLOAT16,
))
