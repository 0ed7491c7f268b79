"""Attention sinks plus a sliding window (StreamingLLM): each query attends to the first
``sinks`` real keys and the last ``window`` real keys up to itself, with exact softmax.

Keys are counted by *rank* among the real (unpadded) keys, so padding never moves a row's
window. :func:`window_attention` runs on the executor
:func:`~attnlab.ops.sparse_attention.executors.executor_for` picks: ``native`` for decoding
rows (each row's sinks and window as two runs through the native kernel), ``flex`` (the
window as FlexAttention's block mask: no host synchronisation, the GPU's prefill), or
``torch``: blocks of queries, each reading only the sink keys and the keys its window spans
(O(T * (sinks + window)) work and memory). :func:`window_attention_naive` is the dense-mask
reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.attention.masks import key_ranks, masked_attention, rank_positions
from attnlab.ops.sparse_attention.executors import EXECUTORS, executor_for
from attnlab.ops.sparse_attention.flex import (
    block_mask_of_tiles,
    blocks_of_spans,
    default_q_block,
    flex_attend,
    flex_serves,
)
from attnlab.ops.sparse_attention.runs import run_attention

QUERY_BLOCK = 256
RUN_ROWS = 16
"""Up to this many query rows (decoding), without autograd or score bias, each row reads its
own sinks and window as two runs through the native kernel: the blocks' shared key columns
would be the union of the batch's windows under padding, at batch 8 about nine windows."""

WINDOW_EXECUTORS = tuple(name for name in EXECUTORS if name != "triton")
"""The executors that run the window (the Triton kernel reads page selections only)."""


def _allowed(ranks: Tensor, counts: Tensor, q_pos: Tensor, k_pos: Tensor, sinks: int,
             window: int) -> Tensor:
    """``[B, 1, Tq', Tk']`` bool: real key, not after the query, a sink or within the window.
    ranks, counts ``[B, Tk]`` (:func:`key_ranks`, :func:`_counts`); q_pos, k_pos: positions of
    the queries and keys used. A padded query's window ends at the last real key before it."""
    rank_q = (counts[:, q_pos] - 1).clamp_min(0)[:, :, None]
    rank_k = ranks[:, k_pos][:, None, :]
    return _reads(rank_q, rank_k, q_pos[None, :, None], k_pos[None, None, :], sinks,
                  window)[:, None]


def _reads(rank_q: Tensor, rank_k: Tensor, q_pos: Tensor, k_pos: Tensor, sinks: int,
           window: int) -> Tensor:
    """Whether a query (its last real key's rank, its position) reads a key (its rank, -1
    for padding; its position): a real key, not after the query, a sink or in the window.
    Broadcasts."""
    return (rank_k >= 0) & (k_pos <= q_pos) & ((rank_k < sinks) | (rank_q - rank_k < window))


PairBias = Callable[[Tensor, Tensor], Tensor]
"""``bias(queries [n, 1], keys [1, m]) -> [B or 1, H or 1, n, m]``: an additive score bias at
query indices (``0..Tq-1``) and key indices (``0..Tk-1``), e.g. ``ScoreBias.at``."""


def _counts(ranks: Tensor) -> Tensor:
    """``[B, Tk]`` real keys up to and including each position."""
    return (ranks + 1).cummax(-1).values


def _position(counts: Tensor, rank: Tensor) -> Tensor:
    """``[B]`` position of the key of ``rank`` ``[B]`` (clamped at 0) in each row: the first
    position whose running count of real keys exceeds it (``Tk`` when the row has fewer)."""
    target = rank.clamp_min(0).to(counts.device)[:, None] + 1
    return torch.searchsorted(counts.contiguous(), target).squeeze(-1)


def check_window(sinks: int, window: int) -> None:
    """``ValueError`` unless ``sinks >= 0`` and ``window >= 1``."""
    if sinks < 0:
        raise ValueError(f"sinks must be >= 0, got {sinks}")
    if window < 1:
        raise ValueError(f"window must be >= 1 key, got {window}")


def _sink_end(counts: Tensor, sinks: int) -> int:
    """Columns ``[0, end)`` hold every row's first ``sinks`` real keys."""
    if sinks == 0:
        return 0
    return int(_position(counts, torch.full((counts.shape[0],), sinks - 1)).max()) + 1


def window_cache_columns(
    key_padding_mask: Tensor | None, n_keys: int, *, sinks: int, window: int
) -> Tensor:
    """``[n]`` increasing columns of ``n_keys`` cached keys that later queries can still
    attend to: each row's first ``sinks`` real keys and its last ``window - 1`` real keys.

    Decoding from only these keys (with their true positions) equals decoding from all of
    them: every other key is outside the window of every later query. Padding columns
    between kept ones stay (columns are shared by the batch), so with left padding at most
    ``pad + sinks + window - 1`` columns remain.
    """
    check_window(sinks, window)
    device = None if key_padding_mask is None else key_padding_mask.device
    b = 1 if key_padding_mask is None else key_padding_mask.shape[0]
    counts = _counts(key_ranks(key_padding_mask, b, n_keys, device))
    sink_end = _sink_end(counts, sinks)
    recent = n_keys
    if window > 1:
        recent = int(_position(counts, counts[:, -1] - (window - 1)).min())
    columns = torch.arange(n_keys, device=device)
    return columns[(columns < sink_end) | (columns >= recent)]


def window_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, sinks: int, window: int,
    key_padding_mask: Tensor | None = None, score_bias: PairBias | None = None,
    executor: str = "auto",
) -> Tensor:
    """Causal sink + sliding-window attention.

    q ``[B, H, Tq, D]`` (the last ``Tq`` of the keys), k, v ``[B, Hk, Tk, D]`` (``Hk``
    divides ``H``), key_padding_mask ``[B, Tk]`` (True = real key) -> ``[B, H, Tq, Dv]``.
    ``score_bias`` (:data:`PairBias`) is evaluated only at the pairs of each query block.
    ``executor``: which computes it (module docstring; the native kernel serves up to
    :data:`RUN_ROWS` rows, and ``flex`` on CPU takes no gradients: both fall back to
    ``torch`` where they cannot run, with the same result).
    """
    check_window(sinks, window)
    b, t_q, t_k = q.shape[0], q.shape[-2], k.shape[-2]
    ranks = key_ranks(key_padding_mask, b, t_k, q.device)
    counts = _counts(ranks)
    chosen = executor_for(executor, q, k, v, biased=score_bias is not None,
                          native_fits=t_q <= RUN_ROWS)
    if chosen == "native":
        return _window_runs(q, k, v, counts[:, t_k - t_q:] - 1, scale, sinks, window,
                            None if key_padding_mask is None else rank_positions(key_padding_mask))
    if chosen == "flex" and flex_serves(q, k, v):
        mask = window_block_mask(ranks, counts, t_q, q.shape[1], sinks=sinks, window=window)
        return flex_attend(q, k, v, mask, scale=scale)
    sink_end = _sink_end(counts, sinks)
    out = []
    for start in range(0, t_q, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, t_q)
        first_q = t_k - t_q + start
        lo = int(_position(counts, counts[:, first_q] - window).min())
        hi = t_k - t_q + stop
        k_pos = torch.arange(lo, hi, device=q.device)
        if sink_end > lo:
            k_pos = torch.arange(0, hi, device=q.device)
        elif sink_end:
            k_pos = torch.cat((torch.arange(0, sink_end, device=q.device), k_pos))
        q_pos = torch.arange(first_q, hi, device=q.device)
        allowed = _allowed(ranks, counts, q_pos, k_pos, sinks, window)
        bias = None
        if score_bias is not None:
            bias = score_bias(torch.arange(start, stop, device=q.device)[:, None], k_pos[None])
        out.append(masked_attention(q[..., start:stop, :], k[..., k_pos, :], v[..., k_pos, :],
                                    allowed, scale, bias))
    return torch.cat(out, dim=-2)


def window_block_mask(ranks: Tensor, counts: Tensor, t_q: int, n_heads: int, *, sinks: int,
                      window: int, q_block: int | None = None, kv_block: int | None = None
                      ) -> Any:
    """FlexAttention's ``BlockMask`` of the window for the last ``t_q`` of the keys and
    ``n_heads`` query heads: each tile of ``q_block`` rows (None:
    :func:`~attnlab.ops.sparse_attention.flex.default_q_block`) reads the key blocks of
    ``kv_block`` (None: ``q_block``) its rows' sinks and windows span, and the ``mask_mod``
    keeps exactly each row's keys (:func:`_allowed`). ranks, counts ``[B, Tk]``
    (:func:`key_ranks`, :func:`_counts`); nothing is read back to the host."""
    b, t_k = ranks.shape
    q_block = q_block or default_q_block(ranks.device)
    kv_block = kv_block or q_block
    offset = t_k - t_q
    n_q, n_k = -(-t_q // q_block), -(-t_k // kv_block)
    first_row = offset + torch.arange(n_q, device=ranks.device) * q_block  # key positions
    last_row = (first_row + q_block - 1).clamp_max(t_k - 1)
    # the window of a tile's first row starts at the tile's lowest key
    start_rank = (counts[:, first_row] - window).clamp_min(0)  # [B, Nq]
    window_lo = torch.searchsorted(counts.contiguous(), start_rank + 1).clamp_max(t_k - 1)
    sink_hi = torch.searchsorted(counts.contiguous(), torch.full((b, 1), max(sinks, 1),
                                                                 device=ranks.device))
    first = torch.stack((torch.zeros_like(window_lo), window_lo), -1) // kv_block
    last = torch.stack((sink_hi.clamp_max(t_k - 1).expand_as(window_lo),
                        last_row.expand_as(window_lo)), -1) // kv_block
    used = torch.ones_like(first, dtype=torch.bool)
    if not sinks:
        used[..., 0] = False
    tiles = blocks_of_spans(first, last, used, n_k)[:, None]  # [B, 1, Nq, Nk]

    def mask_mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return _reads(counts[b, i + offset] - 1, ranks[b, j], i + offset, j, sinks, window)

    return block_mask_of_tiles(tiles, mask_mod, t_q, t_k, q_block, kv_block, n_heads)


def _window_runs(q: Tensor, k: Tensor, v: Tensor, q_rank: Tensor, scale: float, sinks: int,
                 window: int, rank_to_pos: Tensor | None) -> Tensor:
    """Each query row over two runs of ranks per head: the sinks ``[0, min(sinks, r + 1))``
    and the window ``[max(sinks, r - window + 1), r + 1)``, ``r`` ``[B, Tq]`` the rank of the
    row's last real key (-1: none)."""
    n_heads = q.shape[1]
    ends = (q_rank + 1).clamp_min(0)
    sink_count = ends.clamp_max(sinks)
    window_lo = (ends - window).clamp_min(sinks)
    lo = torch.stack((torch.zeros_like(ends), window_lo), -1)
    count = torch.stack((sink_count, (ends - window_lo).clamp_min(0)), -1)
    head = torch.arange(n_heads, device=q.device).repeat_interleave(2)
    shape = (*q_rank.shape, 2 * n_heads)
    lo, count = lo.repeat(1, 1, n_heads), count.repeat(1, 1, n_heads)
    return run_attention(q, k, v, head.expand(shape), lo, count, count, scale=scale,
                         rank_to_pos=rank_to_pos, validate=False)


def window_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, sinks: int, window: int,
    key_padding_mask: Tensor | None = None, score_bias: Tensor | None = None,
) -> Tensor:
    """Reference of :func:`window_attention`: the dense ``[B, 1, Tq, Tk]`` mask (and a dense
    ``score_bias`` broadcastable to ``[B, H, Tq, Tk]``)."""
    check_window(sinks, window)
    b, t_q, t_k = q.shape[0], q.shape[-2], k.shape[-2]
    ranks = key_ranks(key_padding_mask, b, t_k, q.device)
    allowed = _allowed(ranks, _counts(ranks), torch.arange(t_k - t_q, t_k, device=q.device),
                       torch.arange(t_k, device=q.device), sinks, window)
    return masked_attention(q, k, v, allowed, scale, score_bias)


def _example(gen: torch.Generator, *, sinks: int, window: int, padded: bool = False,
             t_q: int = 37, t_k: int = 37, hk: int = 2, executor: str = "auto"
             ) -> contract.Example:
    """Batch 2, 4 query heads; padding: a hole, and left padding; ``executor`` for the fast
    op."""
    qkv = contract.attention_inputs(gen, hk=hk, t_q=t_q, t_k=t_k)
    return contract.Example({**qkv, "scale": 0.3, "sinks": sinks, "window": window,
                             "key_padding_mask": contract.padding_mask(2, t_k) if padded else None},
                            contract.attention_shape(qkv), options={"executor": executor})


contract.register(contract.OpContract(
    "window_attention", window_attention, window_attention_naive, _example,
    cases=(
        *(case for sinks, window in ((0, 1), (2, 5), (4, 16), (3, 100))
          for case in contract.grid(patches=((f"{__name__}.QUERY_BLOCK", 8),),  # several blocks
                                    sinks=(sinks,), window=(window,), padded=(False, True),
                                    t_q=(37, 3))),
        contract.Case("heads-equal", {"sinks": 2, "window": 5, "hk": 4}),
        *(case for sinks, window in ((0, 1), (2, 5), (3, 100))
          for case in contract.grid(label="flex", executor=("flex",), sinks=(sinks,),
                                    window=(window,), padded=(False, True), t_q=(37, 3))),
        contract.Case("one-query-one-key", {"sinks": 1, "window": 1, "t_q": 1, "t_k": 1}),
    ),
    low_precision=contract.FLOAT32,
))
