"""A page selector's choice of pages in two Triton kernels spread over many programs: the
split counterpart of the fused step kernel's selection
(:mod:`attnlab.ops.sparse_attention.triton_pages`).

The fused kernel runs one program per (query row, KV head): at batch 8 and 3 KV heads that
is 24 programs, each scoring every page of a long context alone. Here the page logits are
computed by one program per (query row, query head, chunk of :data:`CHUNK_PAGES` pages)
into a scratch ``[B, H, Tq, P]``, and a second kernel, one program per (query row, KV head),
turns them into the group's choice exactly as the fused kernel does (a softmax per head
over the candidate pages, summed over the group; the ``n_top`` best sums, ties to the lower
page, beside the sinks and the local pages). The result is a
:class:`~attnlab.ops.sparse_attention.pages.PageSelection` that the block-table kernel
attends over. The parts both paths share live here: a row's candidate pages, a head's page
logits and their softmax. Forward only, no host in the loop; tested on CPU under
``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnlab.ops.sparse_attention.pages import PageSelection, row_limits

CHUNK_PAGES = 128
"""Pages a logit program scores."""


@triton.jit
def row_pages(rank_ptr, n_real_ptr, b, t, sr_b, page, n_pages, sink_pages, local_pages,
              causal, NP: tl.constexpr):
    """What row t of batch row b may read: ``valid`` (not a padded query), its rank (0 when
    padded) and own page, its real keys, the pages it may read, and the candidate pages
    ``[NP]`` (readable, neither a sink nor a local page)."""
    pp = tl.arange(0, NP)
    rank = tl.load(rank_ptr + b * sr_b + t)
    valid = rank >= 0
    rank = tl.maximum(rank, 0)
    own = rank // page
    n_real = tl.load(n_real_ptr + b)
    readable = tl.minimum((n_real + page - 1) // page, n_pages)
    if causal:
        readable = tl.minimum(readable, own + 1)
    forced = (pp < sink_pages) | ((pp <= own) & (pp > own - local_pages))
    candidate = (pp < tl.where(valid, readable, 0)) & (forced == 0)
    return valid, rank, own, n_real, readable, candidate


@triton.jit
def distance_buckets(own, pp, n_buckets, NP: tl.constexpr):
    """floor(log2(|own - p| + 1)), at most ``n_buckets - 1``, of pages pp, in integers."""
    distance = tl.abs(own - pp) + 1
    bucket = tl.zeros([NP], tl.int64)
    for i in range(1, n_buckets):
        bucket += ((distance >> i) > 0).to(tl.int64)
    return bucket


@triton.jit
def head_page_logits(qf_row, feat_row, pp, read, bucket, bias_row, n_features, sf_p, scale,
                     HAS_BIAS: tl.constexpr, ACC: tl.constexpr, NP: tl.constexpr,
                     FC: tl.constexpr):
    """One head's logits of pages pp ``[NP]`` (read where ``read``): ``scale * qf . feat``
    over ``n_features`` in chunks of FC, plus its bias of each page's distance bucket."""
    logits = tl.zeros([NP], ACC)
    for f0 in range(0, n_features, FC):
        f = f0 + tl.arange(0, FC)
        qf = tl.load(qf_row + f, mask=f < n_features, other=0.0).to(ACC)
        feat = tl.load(feat_row + pp[:, None] * sf_p + f[None, :],
                       mask=read[:, None] & (f[None, :] < n_features), other=0.0).to(ACC)
        logits += tl.sum(feat * qf[None, :], axis=1)
    logits = logits * scale
    if HAS_BIAS:
        logits += tl.load(bias_row + bucket, mask=read, other=0.0).to(ACC)
    return logits


@triton.jit
def head_probabilities(logits, candidate):
    """One head's softmax over its candidate pages (0 elsewhere; all 0 without one)."""
    logits = tl.where(candidate, logits, float("-inf"))
    top = tl.max(logits, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no candidate: no -inf - -inf
    weights = tl.where(candidate, tl.exp(logits - top), 0.0)
    return weights / tl.maximum(tl.sum(weights, axis=0), 1e-30)


@triton.jit
def _page_logits_kernel(
    qf_ptr, feat_ptr, bias_ptr, rank_ptr, logits_ptr,
    scale, page, group, n_features, n_pages, n_buckets, n_chunks,
    sqf_b, sqf_h, sqf_t, sf_b, sf_h, sf_p, sr_b, sl_b, sl_h, sl_t,
    HAS_BIAS: tl.constexpr, HEAD_FEATURES: tl.constexpr, ACC: tl.constexpr,
    CP: tl.constexpr, FC: tl.constexpr,
):
    """logits[b, head, t, chunk's pages] = scale * qf . feat (+ bias by distance bucket)."""
    t = tl.program_id(0).to(tl.int64)
    pid = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    head = pid // n_chunks
    pp = (pid % n_chunks) * CP + tl.arange(0, CP)
    inside = pp < n_pages
    feat_head = head if HEAD_FEATURES else head // group
    own = tl.maximum(tl.load(rank_ptr + b * sr_b + t), 0) // page
    logits = head_page_logits(
        qf_ptr + b * sqf_b + head * sqf_h + t * sqf_t, feat_ptr + b * sf_b + feat_head * sf_h,
        pp, inside, distance_buckets(own, pp, n_buckets, CP), bias_ptr + head * n_buckets,
        n_features, sf_p, scale, HAS_BIAS, ACC, CP, FC)
    tl.store(logits_ptr + b * sl_b + head * sl_h + t * sl_t + pp, logits, mask=inside)


@triton.jit
def _choose_pages_kernel(
    logits_ptr, rank_ptr, n_real_ptr, pages_ptr,
    page, group, n_pages, sink_pages, local_pages, n_top, causal,
    sl_b, sl_h, sl_t, sr_b, sp_b, sp_h, sp_t,
    ACC: tl.constexpr, P_BLOCK: tl.constexpr,
):
    """pages[b, h, t, :] = the sinks, the local pages and the ``n_top`` best candidates of
    KV head h's group (-1: a slot left unused)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    pp = tl.arange(0, P_BLOCK)
    valid, rank, own, n_real, readable, candidate = row_pages(
        rank_ptr, n_real_ptr, b, t, sr_b, page, n_pages, sink_pages, local_pages, causal,
        P_BLOCK)
    mass = tl.zeros([P_BLOCK], ACC)
    for j in range(0, group):
        logits = tl.load(logits_ptr + b * sl_b + (h * group + j) * sl_h + t * sl_t + pp,
                         mask=candidate, other=float("-inf"))
        mass += head_probabilities(logits, candidate)
    row = pages_ptr + b * sp_b + h * sp_h + t * sp_t
    for p in range(0, sink_pages):
        tl.store(row + p, tl.where(valid & (p < readable), p, -1))
    for i in range(0, local_pages):  # the query's own page and those before it
        p = own - i
        tl.store(row + sink_pages + i,
                 tl.where(valid & (p >= sink_pages) & (p < readable), p, -1))
    left = tl.where(candidate, mass, -1.0)  # masses are >= 0: -1 marks no candidate
    for i in range(0, n_top):
        best = tl.argmax(left, axis=0)  # the lowest page of the largest mass
        tl.store(row + sink_pages + local_pages + i,
                 tl.where(tl.max(left, axis=0) >= 0, best, -1))
        left = tl.where(pp == best, -1.0, left)


def select_best_pages(
    query_features: Tensor, features: Tensor, bias: Tensor | None, q_rank: Tensor,
    n_real: Tensor, *, n_kv_heads: int, page: int, sink_pages: int, local_pages: int,
    n_top: int, causal: bool, scale: float, rank_to_pos: Tensor | None,
) -> PageSelection:
    """The pages each (row, KV head) of a step reads, as the fused step kernel chooses them:
    query_features ``[B, H, Tq, F]``, features ``[B, Hk or H, P, F]``, bias ``[H,
    n_buckets]`` or None, q_rank ``[B, Tq]`` (-1: padded), n_real ``[B]``; ``PageSelection``
    pages ``[B, Hk, Tq, sink_pages + local_pages + n_top]``."""
    b, h, t_q, n_features = query_features.shape
    n_pages = features.shape[2]
    query_features, features = (x if x.stride(-1) == 1 else x.contiguous()
                                for x in (query_features, features))
    ranks = q_rank.to(torch.int64).contiguous()
    counts = n_real.to(torch.int64).contiguous()
    table = None if bias is None else bias.detach().contiguous()
    acc = torch.float64 if query_features.dtype == torch.float64 else torch.float32
    logits = torch.empty(b, h, t_q, n_pages, dtype=acc, device=query_features.device)
    pages = torch.empty(b, n_kv_heads, t_q, sink_pages + local_pages + n_top,
                        dtype=torch.int64, device=query_features.device)
    selection = PageSelection(pages, page, row_limits(ranks, counts, causal), rank_to_pos)
    if pages.numel() == 0 or n_pages == 0:
        pages.fill_(-1)
        return selection
    acc_tl = tl.float64 if acc == torch.float64 else tl.float32
    chunk = min(CHUNK_PAGES, triton.next_power_of_2(n_pages))
    n_chunks = triton.cdiv(n_pages, chunk)
    _page_logits_kernel[(t_q, h * n_chunks, b)](
        query_features, features, ranks if table is None else table, ranks, logits,
        scale, page, h // n_kv_heads, n_features, n_pages,
        0 if table is None else table.shape[1], n_chunks,
        *query_features.stride()[:3], *features.stride()[:3], ranks.stride(0),
        *logits.stride()[:3],
        HAS_BIAS=table is not None, HEAD_FEATURES=features.shape[1] == h, ACC=acc_tl,
        CP=chunk, FC=min(triton.next_power_of_2(n_features), 64),
    )
    _choose_pages_kernel[(t_q, n_kv_heads, b)](
        logits, ranks, counts, pages, page, h // n_kv_heads, n_pages, sink_pages,
        local_pages, n_top, int(causal), *logits.stride()[:3], ranks.stride(0),
        *pages.stride()[:3], ACC=acc_tl, P_BLOCK=triton.next_power_of_2(n_pages),
    )
    return selection
