"""The FlexAttention executor: block-sparse, with no host in the loop.

:func:`flex_attend` runs FlexAttention on a block mask (compiled where it pays; shared by
the page selectors, the window in :mod:`attnlab.ops.attention.window` and the ``flex``
core); :func:`block_mask_of_tiles` and :func:`blocks_of_spans` build a block mask from the
key blocks each tile of queries reads.

A :class:`~attnlab.ops.sparse_attention.pages.PageSelection` says which pages each query
row reads. FlexAttention runs on tiles of ``q_block`` query rows x ``kv_block`` key
positions, so :func:`page_block_mask` turns the selection into its ``BlockMask``: for each
(batch, query head, query block) the key blocks that any row of the block reads (the
union over its rows: the block-sparse row format), and a ``mask_mod`` that keeps, inside
those tiles, exactly the keys each row reads (its pages, its causal limit, no padding). The
tiles give the speed; the ``mask_mod`` gives exactness, so the result equals
:func:`~attnlab.ops.sparse_attention.pages.attend_pages_naive` whatever the union.

Every tensor keeps a fixed shape (``[B, H, Tq / q_block, Tk / kv_block]`` block indices,
unused ones last), so building the mask reads nothing back to the host.

The kernel is compiled (``torch.compile``, once per shape), except for fewer than
:data:`COMPILE_MIN_QUERIES` rows (a decoding step, whose key count changes every step),
which run FlexAttention's eager form (the same result; it materialises the scores). Torch
2.13 has no FlexAttention backward on CPU, so a CPU call that needs gradients runs
:func:`~attnlab.ops.sparse_attention.pages.attend_pages` instead (the same result).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from typing import Any

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.sparse_attention.executors import COMPILE_MIN_QUERIES
from attnlab.ops.sparse_attention.pages import (
    PageSelection,
    attend_pages,
    attend_pages_naive,
    selection_example,
)

logger = logging.getLogger(__name__)

Q_BLOCK = 128
"""Query rows per tile off the CPU (FlexAttention's default; not measured here)."""
CPU_Q_BLOCK = 16
"""Query rows per tile on CPU. Measured on the 2-core dev box, one SmolLM2-shaped layer (9
heads of 64, 3 KV heads) at 8192 tokens, Quest at a budget of 256 on random inputs
(docs/results/flex-executor-cpu): the compiled kernel took 541 / 674 / 775 / 891 ms with
tiles of 16 / 32 / 64 / 128 rows, which read 14 / 18 / 22 / 26% of the key blocks (the
union of the rows' pages grows with the tile)."""
RECOMPILE_LIMIT = 64
"""Compiled kernels kept per process (one per shape and tile size). Torch's default of 8
is reached by a run over a few lengths and executors, after which every call silently ran
the eager form (measured: 12.8-14.8 s instead of 0.8-0.9 s for one layer at 8k); dynamic
shapes do not compile on CPU with torch 2.13 (an inductor C++ error), so each shape has
its own."""


@functools.cache
def compiled_flex_attention() -> Any:
    """``flex_attention`` compiled for fixed shapes (one compile per shape, cached)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_serves(*tensors: Tensor) -> bool:
    """Whether FlexAttention can run on these inputs: not on CPU when they need gradients."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return not (tensors[0].device.type == "cpu" and needs_grad)


def _position_ranks(selection: PageSelection, t_k: int, device: torch.device) -> Tensor:
    """``[B, Tk]`` int64: each key position's rank (padding positions get ranks past every
    row's limit, so no row reads them)."""
    b = selection.limit.shape[0]
    ranks = torch.arange(t_k, device=device)
    if selection.rank_to_pos is None:
        return ranks.expand(b, t_k)
    return torch.empty(b, t_k, dtype=torch.long, device=device).scatter_(
        1, selection.rank_to_pos, ranks.expand(b, t_k))


def _read_pages(selection: PageSelection, n_pages: int) -> Tensor:
    """``[B, Hk, Tq, P]`` bool: the pages each row reads per KV head."""
    pages = selection.pages
    read = torch.zeros(*pages.shape[:-1], n_pages + 1, dtype=torch.bool, device=pages.device)
    read.scatter_(-1, pages.masked_fill(pages < 0, n_pages), True)  # -1 -> a spare column
    return read[..., :n_pages]


def _tile_blocks(selection: PageSelection, read: Tensor, t_k: int, q_block: int,
                 kv_block: int) -> Tensor:
    """``[B, Hk, Nq, Nk]`` bool: the key blocks some row of each query block reads."""
    b, h_kv, t_q, n_pages = read.shape
    n_q = -(-t_q // q_block)
    n_k = -(-t_k // kv_block)
    by_tile = torch.nn.functional.pad(read, (0, 0, 0, n_q * q_block - t_q))
    by_tile = by_tile.view(b, h_kv, n_q, q_block, n_pages).any(3)
    # a page's ranks lie between the positions of its first and its last readable rank
    # (ranks are in position order below every limit), so it spans those key blocks
    readable = selection.limit.max(-1).values.clamp_min(1)  # [B]
    first = torch.arange(n_pages, device=read.device) * selection.page
    last = torch.minimum(first + selection.page, readable[:, None]) - 1  # [B, P]
    first = torch.minimum(first[None], last)
    if selection.rank_to_pos is not None:
        first = selection.rank_to_pos.gather(1, first)
        last = selection.rank_to_pos.gather(1, last)
    first, last = (x[:, None, None].expand_as(by_tile) // kv_block for x in (first, last))
    return blocks_of_spans(first, last, by_tile, n_k)


def blocks_of_spans(first: Tensor, last: Tensor, used: Tensor, n_blocks: int) -> Tensor:
    """``[..., n_blocks]`` bool: the blocks covered by some used span of blocks ``first`` to
    ``last`` (int64 ``[..., S]``, inclusive; ``used`` bool ``[..., S]``)."""
    # +1 at a span's first block and -1 after its last, summed along the blocks
    steps = torch.zeros(*used.shape[:-1], n_blocks + 1, device=used.device)
    weight = used.to(steps.dtype)
    steps.scatter_add_(-1, first, weight)
    steps.scatter_add_(-1, last + 1, -weight)
    return steps.cumsum(-1)[..., :n_blocks] > 0.5


def block_mask_of_tiles(tiles: Tensor, mask_mod: Any, t_q: int, t_k: int, q_block: int,
                        kv_block: int, group: int) -> Any:
    """FlexAttention's ``BlockMask`` from the key blocks each tile of queries reads,
    ``tiles`` ``[B, Hk, Nq, Nk]`` bool (expanded to ``group`` query heads per KV head), and
    the ``mask_mod`` that keeps exactly each row's keys inside them."""
    from torch.nn.attention.flex_attention import BlockMask

    counts = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort((~tiles).to(torch.uint8), dim=-1, stable=True).to(torch.int32)
    return BlockMask.from_kv_blocks(
        counts.repeat_interleave(group, 1), order.repeat_interleave(group, 1),
        BLOCK_SIZE=(q_block, kv_block), mask_mod=mask_mod, seq_lengths=(t_q, t_k))


def default_q_block(device: torch.device) -> int:
    """Query rows per tile: :data:`CPU_Q_BLOCK` on CPU, else :data:`Q_BLOCK`."""
    return CPU_Q_BLOCK if device.type == "cpu" else Q_BLOCK


def page_block_mask(selection: PageSelection, n_heads: int, t_k: int, *,
                    q_block: int | None = None, kv_block: int | None = None) -> Any:
    """FlexAttention's ``BlockMask`` of ``selection`` for ``n_heads`` query heads over ``t_k``
    key positions: tiles of ``q_block`` rows (None: :data:`CPU_Q_BLOCK` on CPU, else
    :data:`Q_BLOCK`) x ``kv_block`` keys (None: the page size)."""
    device = selection.pages.device
    q_block = q_block or default_q_block(device)
    kv_block = kv_block or selection.page
    h_kv, t_q = selection.pages.shape[1:3]
    group, page = n_heads // h_kv, selection.page
    n_pages = -(-t_k // page)
    read = _read_pages(selection, n_pages)
    tiles = _tile_blocks(selection, read, t_k, q_block, kv_block)
    pos_rank, limit = _position_ranks(selection, t_k, device), selection.limit

    def mask_mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        rank = pos_rank[b, j]
        return (rank < limit[b, i]) & read[b, h // group, i, rank // page]

    return block_mask_of_tiles(tiles, mask_mod, t_q, t_k, q_block, kv_block, group)


@functools.cache
def _say(what: str) -> None:
    logger.info("flex executor: %s (same result)", what)


def attend_pages_flex(q: Tensor, k: Tensor, v: Tensor, selection: PageSelection, *,
                      scale: float, q_block: int | None = None, kv_block: int | None = None
                      ) -> Tensor:
    """Exact softmax of q ``[B, H, Tq, D]`` over its selected keys of k, v ``[B, Hk, Tk, D]``
    -> ``[B, H, Tq, Dv]`` (0 for a row that reads none), through FlexAttention on the
    selection's block mask (:func:`page_block_mask`)."""
    if not flex_serves(q, k, v):
        _say("no FlexAttention backward on CPU; gradients through the gather path")
        return attend_pages(q, k, v, selection, scale=scale)
    block_mask = page_block_mask(selection, q.shape[1], k.shape[-2], q_block=q_block,
                                 kv_block=kv_block)
    return flex_attend(q, k, v, block_mask, scale=scale)


def flex_attend(q: Tensor, k: Tensor, v: Tensor, block_mask: Any, *, scale: float,
                score_mod: Any = None) -> Tensor:
    """FlexAttention of q ``[B, H, Tq, D]`` over k, v ``[B, Hk, Tk, D]`` on ``block_mask``
    (None: every key) with ``score_mod`` (None: none): compiled from
    :data:`COMPILE_MIN_QUERIES` rows, eager below (module docstring); a row with no key
    outputs 0."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled = q.shape[-2] >= COMPILE_MIN_QUERIES
    if not compiled:
        _say(f"fewer than {COMPILE_MIN_QUERIES} query rows run FlexAttention's eager form")
    attend = compiled_flex_attention() if compiled else flex_attention
    with warnings.catch_warnings(), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        # the eager form is chosen, and said once (above)
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        return attend(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                      enable_gqa=k.shape[1] != q.shape[1])


def _example(gen: torch.Generator, **params: Any) -> contract.Example:
    """:func:`~attnlab.ops.sparse_attention.pages.attend_pages`' examples, with tiles of 4
    rows x 2 keys (pages of 3 keys straddle the key blocks)."""
    return dataclasses.replace(selection_example(gen, **params),
                               options={"q_block": 4, "kv_block": 2})


contract.register(contract.OpContract(
    "attend_pages_flex", attend_pages_flex, attend_pages_naive, _example,
    cases=(
        *contract.grid(padded=(False, True), causal=(True, False)),
        *contract.grid(label="cache", padded=(True,), t_q=(1, 5)),
        *contract.grid(label="one-key", t_q=(1,), t_k=(1,)),
    ),
    low_precision=contract.FLOAT32_BFLOAT16,
))
