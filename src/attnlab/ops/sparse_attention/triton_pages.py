"""The Triton executor of the page selectors: a decoding step's page scores, selection and
attention in one kernel, and the attention over any page selection read as a block table
(as a paged KV cache's); no host in the loop.

Only imported when the executor runs (``import triton`` happens here; callers import it at
first use: :func:`attnlab.ops.sparse_attention.pages.attend_pages_triton`,
:func:`attnlab.ops.attention.page_step.attend_best_pages`). Both kernels run one program per
(query row, KV head, batch row), holding the query heads of its KV group, and keep an online
softmax over the keys of the pages they read (ranks below the row's limit, mapped to
positions by ``rank_to_pos`` under padding), ``budget`` keys and values per KV head:

- :func:`attend_pages_kernel` walks the row's selected page slots (``PageSelection.pages``,
  -1 = unused);
- :func:`best_pages_kernel` first selects them, as the native CPU kernel does: every head's
  page logits from the kept page features, a softmax per head summed over the group, the
  best pages beside the sinks and local pages. Where its programs would be few and the
  pages many, the selection runs split over many programs instead
  (:mod:`~attnlab.ops.sparse_attention.triton_select`), then the block-table kernel.

The products are elementwise sums rather than ``tl.dot``: a decoding row has a handful of
heads, and the interpreter's ``tl.dot`` is wrong in bfloat16. Accumulates in float32
(float64 for float64 inputs). Forward only: no gradients (the executors' chooser never sends
it a call that needs them). Every shape is fixed by the inputs' shapes, so a call reads
nothing back to the host. Tested on CPU under ``TRITON_INTERPRET=1``
(tests/ops/test_triton_pages.py, tests/layers/test_page_state.py) and written for CUDA;
``scripts/gpu-check.sh`` runs them on a GPU when one is lent.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnlab.ops.sparse_attention.pages import PageSelection
from attnlab.ops.sparse_attention.triton_select import (
    distance_buckets,
    head_page_logits,
    head_probabilities,
    row_pages,
    select_best_pages,
)

_TL_ACC = {torch.float32: tl.float32, torch.float64: tl.float64}


@triton.jit
def _attend_page(q, m, total, acc, p, k_row, v_row, pos_row, page, limit, sk_t, sv_t,
                 d_qk, d_v, scale, HAS_POS: tl.constexpr, ACC: tl.constexpr,
                 PB: tl.constexpr, D: tl.constexpr, DV: tl.constexpr):
    """One page ``p`` of keys (ranks ``p * page ...``, those below ``limit``: a limit of 0
    reads none) into the group's online softmax: q ``[G, D]``, the running max m and sum
    total ``[G]``, acc ``[G, DV]``; k_row, v_row, pos_row: the batch row's (and KV head's)
    bases. (Scalar conditions enter as numbers: the interpreter mistypes a scalar bool
    combined with a block.)"""
    j = tl.arange(0, PB)
    d = tl.arange(0, D)
    dv = tl.arange(0, DV)
    ranks = p * page + j  # an unused slot (p = -1): all negative
    read = (j < page) & (ranks >= 0) & (ranks < limit)
    if HAS_POS:
        at = tl.load(pos_row + ranks, mask=read, other=0)
    else:
        at = ranks
    keys = tl.load(k_row + at[:, None] * sk_t + d[None, :],
                   mask=read[:, None] & (d[None, :] < d_qk), other=0.0).to(ACC)
    scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [G, PB]
    scores = tl.where(read[None, :], scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: keep zeros
    probs = tl.exp(scores - shift[:, None])
    decay = tl.exp(m - shift)
    values = tl.load(v_row + at[:, None] * sv_t + dv[None, :],
                     mask=read[:, None] & (dv[None, :] < d_v), other=0.0).to(ACC)
    total = total * decay + tl.sum(probs, axis=1)
    acc = acc * decay[:, None] + tl.sum(probs[:, :, None] * values[None, :, :], axis=1)
    return m_new, total, acc


@triton.jit
def _group_queries(q_ptr, b, h, t, group, d_qk, sq_b, sq_h, sq_t, ACC: tl.constexpr,
                   G: tl.constexpr, D: tl.constexpr):
    """The queries ``[G, D]`` of KV head h's group of heads at row t (0 past the group)."""
    g = tl.arange(0, G)
    d = tl.arange(0, D)
    return tl.load(q_ptr + b * sq_b + (h * group + g)[:, None] * sq_h + t * sq_t + d[None, :],
                   mask=(g[:, None] < group) & (d[None, :] < d_qk), other=0.0).to(ACC)


@triton.jit
def _store_group(out_ptr, acc, total, b, h, t, group, d_v, so_b, so_h, so_t,
                 G: tl.constexpr, DV: tl.constexpr):
    """The group's softmax-weighted values ``acc / total`` (0 for a head that read no key)."""
    g = tl.arange(0, G)
    dv = tl.arange(0, DV)
    out = tl.where(total[:, None] > 0, acc / tl.where(total > 0, total, 1.0)[:, None], 0.0)
    tl.store(out_ptr + b * so_b + (h * group + g)[:, None] * so_h + t * so_t + dv[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(g[:, None] < group) & (dv[None, :] < d_v))


@triton.jit
def _selected_pages_kernel(
    q_ptr, k_ptr, v_ptr, pages_ptr, limit_ptr, pos_ptr, out_ptr,
    scale, n_slots, page, group, d_qk, d_v,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
    sp_b, sp_h, sp_t, sl_b, spos_b, so_b, so_h, so_t,
    HAS_POS: tl.constexpr, ACC: tl.constexpr,
    G: tl.constexpr, PB: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
):
    """out[b, heads of KV head h, t] = softmax over the row's selected keys (module
    docstring); the last dims of q, k, v and out are contiguous."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    q = _group_queries(q_ptr, b, h, t, group, d_qk, sq_b, sq_h, sq_t, ACC, G, D)
    limit = tl.load(limit_ptr + b * sl_b + t)
    m = tl.full([G], float("-inf"), ACC)
    total = tl.zeros([G], ACC)
    acc = tl.zeros([G, DV], ACC)
    for s in range(0, n_slots):
        p = tl.load(pages_ptr + b * sp_b + h * sp_h + t * sp_t + s)
        m, total, acc = _attend_page(
            q, m, total, acc, p, k_ptr + b * sk_b + h * sk_h,
            v_ptr + b * sv_b + h * sv_h, pos_ptr + b * spos_b, page, limit, sk_t, sv_t, d_qk,
            d_v, scale, HAS_POS, ACC, PB, D, DV)
    _store_group(out_ptr, acc, total, b, h, t, group, d_v, so_b, so_h, so_t, G, DV)


@triton.jit
def _best_pages_kernel(
    q_ptr, k_ptr, v_ptr, qf_ptr, feat_ptr, bias_ptr, rank_ptr, n_real_ptr, pos_ptr, out_ptr,
    scale, page, group, d_qk, d_v, n_features, n_pages, n_buckets, sink_pages, local_pages,
    n_top, causal,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sqf_b, sqf_h, sqf_t,
    sf_b, sf_h, sf_p, sr_b, spos_b, so_b, so_h, so_t,
    HAS_POS: tl.constexpr, HAS_BIAS: tl.constexpr, HEAD_FEATURES: tl.constexpr,
    ACC: tl.constexpr, G: tl.constexpr, PB: tl.constexpr, D: tl.constexpr,
    DV: tl.constexpr, P_BLOCK: tl.constexpr, FC: tl.constexpr,
):
    """A page selector's step for (row t, KV head h, batch row b), as the native kernel's:
    each group head's page logits ``scale * qf . feat (+ bias by distance bucket)`` over the
    candidate pages, a softmax per head summed over the group, the ``n_top`` best sums
    (ties: the lower page) beside the forced pages, then the group's attention over them."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    pp = tl.arange(0, P_BLOCK)
    q = _group_queries(q_ptr, b, h, t, group, d_qk, sq_b, sq_h, sq_t, ACC, G, D)
    valid, rank, own, n_real, readable, candidate = row_pages(
        rank_ptr, n_real_ptr, b, t, sr_b, page, n_pages, sink_pages, local_pages, causal,
        P_BLOCK)
    limit = tl.where(causal != 0, rank + 1, n_real)
    bucket = distance_buckets(own, pp, n_buckets, P_BLOCK)  # shared by the group's heads
    mass = tl.zeros([P_BLOCK], ACC)
    for j in range(0, group):
        head = h * group + j
        feat_head = head if HEAD_FEATURES else h
        logits = head_page_logits(
            qf_ptr + b * sqf_b + head * sqf_h + t * sqf_t,
            feat_ptr + b * sf_b + feat_head * sf_h, pp, candidate, bucket,
            bias_ptr + head * n_buckets, n_features, sf_p, scale, HAS_BIAS, ACC, P_BLOCK, FC)
        mass += head_probabilities(logits, candidate)
    m = tl.full([G], float("-inf"), ACC)
    total = tl.zeros([G], ACC)
    acc = tl.zeros([G, DV], ACC)
    k_row = k_ptr + b * sk_b + h * sk_h
    v_row = v_ptr + b * sv_b + h * sv_h
    pos_row = pos_ptr + b * spos_b
    for p in range(0, sink_pages):
        used = tl.where(valid & (p < readable), limit, 0)
        m, total, acc = _attend_page(q, m, total, acc, p, k_row, v_row, pos_row, page, used,
                                     sk_t, sv_t, d_qk, d_v, scale, HAS_POS, ACC, PB, D, DV)
    for i in range(0, local_pages):  # the query's own page and those before it
        p = own - i
        used = tl.where(valid & (p >= sink_pages) & (p < readable), limit, 0)
        m, total, acc = _attend_page(q, m, total, acc, p, k_row, v_row, pos_row, page, used,
                                     sk_t, sv_t, d_qk, d_v, scale, HAS_POS, ACC, PB, D, DV)
    left = tl.where(candidate, mass, -1.0)  # masses are >= 0: -1 marks no candidate
    for _ in range(0, n_top):
        best = tl.argmax(left, axis=0)  # the lowest page of the largest mass
        used = tl.where(tl.max(left, axis=0) >= 0, limit, 0)
        m, total, acc = _attend_page(q, m, total, acc, best, k_row, v_row, pos_row, page, used,
                                     sk_t, sv_t, d_qk, d_v, scale, HAS_POS, ACC, PB, D, DV)
        left = tl.where(pp == best, -1.0, left)
    _store_group(out_ptr, acc, total, b, h, t, group, d_v, so_b, so_h, so_t, G, DV)


SPLIT_MIN_PAGES = 256
SPLIT_MAX_PROGRAMS = 128
"""A step with at least ``SPLIT_MIN_PAGES`` pages and fewer (row, KV head) programs than
``SPLIT_MAX_PROGRAMS`` (about an H100's SMs) selects through the split kernels
(:mod:`~attnlab.ops.sparse_attention.triton_select`) instead of the fused one. An
estimate until ``scripts/gpu-check.sh`` measures both on a GPU."""

FEATURE_ELEMENTS = 8192
"""Page features a program holds at once (pages x features per chunk): the chunk of
features shrinks as a row's pages grow, keeping registers bounded."""


def _launch_inputs(q: Tensor, k: Tensor, v: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[int, ...], dict]:
    """What both kernels take of q ``[B, H, Tq, D]``, k, v ``[B, Hk, Tk, D]``: the three with
    a contiguous last dim, the output ``[B, H, Tq, Dv]`` (q's dtype), their batch, head and
    row strides, and the constexprs of their shapes and accumulator."""
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=q.dtype, device=q.device)
    strides = tuple(x.stride(i) for x in (q, k, v) for i in range(3))
    shapes = {"ACC": _TL_ACC.get(q.dtype, tl.float32),
              "G": triton.next_power_of_2(q.shape[1] // k.shape[1]),
              "D": triton.next_power_of_2(q.shape[-1]),
              "DV": triton.next_power_of_2(v.shape[-1])}
    return q, k, v, out, strides, shapes


def attend_pages_kernel(q: Tensor, k: Tensor, v: Tensor, selection: PageSelection, *,
                        scale: float) -> Tensor:
    """:func:`~attnlab.ops.sparse_attention.pages.attend_pages` by the Triton kernel: q
    ``[B, H, Tq, D]``, k, v ``[B, Hk, Tk, D]`` (one dtype; CUDA, or CPU under
    ``TRITON_INTERPRET=1``) -> ``[B, H, Tq, Dv]`` in q's dtype (0 for a row that reads none).
    """
    (b, h, t_q, d_qk), h_kv, d_v = q.shape, k.shape[1], v.shape[-1]
    q, k, v, out, strides, shapes = _launch_inputs(q, k, v)
    pages = selection.pages.contiguous()
    limit = selection.limit.contiguous()
    pos = selection.rank_to_pos
    pos = limit if pos is None else pos.contiguous()  # an unread placeholder without padding
    if out.numel() == 0:
        return out
    _selected_pages_kernel[(t_q, h_kv, b)](
        q, k, v, pages, limit, pos, out,
        scale, pages.shape[-1], selection.page, h // h_kv, d_qk, d_v, *strides,
        pages.stride(0), pages.stride(1), pages.stride(2), limit.stride(0), pos.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        HAS_POS=selection.rank_to_pos is not None, PB=triton.next_power_of_2(selection.page),
        **shapes,
    )
    return out


def best_pages_kernel(
    q: Tensor, k: Tensor, v: Tensor, query_features: Tensor, features: Tensor,
    bias: Tensor | None, q_rank: Tensor, n_real: Tensor, *, page: int, sink_pages: int,
    local_pages: int, n_top: int, causal: bool, scale: float, rank_to_pos: Tensor | None,
    split: bool | None = None,
) -> Tensor:
    """A page selector's step in one Triton kernel (arguments as
    :func:`~attnlab.ops.sparse_attention.native.page_attention_native`: query_features
    ``[B, H, Tq, F]``, features ``[B, Hk or H, P, F]``, bias ``[H, n_buckets]`` or None,
    q_rank ``[B, Tq]``, n_real ``[B]``) -> ``[B, H, Tq, Dv]`` in q's dtype. ``split``: select
    through the split kernels and attend through the block-table kernel instead (None: by
    :data:`SPLIT_MIN_PAGES` and :data:`SPLIT_MAX_PROGRAMS`); the same pages either way."""
    (b, h, t_q, d_qk), h_kv, d_v = q.shape, k.shape[1], v.shape[-1]
    if split is None:
        split = (features.shape[2] >= SPLIT_MIN_PAGES
                 and t_q * h_kv * b < SPLIT_MAX_PROGRAMS)
    if split:
        selection = select_best_pages(
            query_features, features, bias, q_rank, n_real, n_kv_heads=h_kv, page=page,
            sink_pages=sink_pages, local_pages=local_pages, n_top=n_top, causal=causal,
            scale=scale, rank_to_pos=rank_to_pos)
        return attend_pages_kernel(q, k, v, selection, scale=scale)
    q, k, v, out, strides, shapes = _launch_inputs(q, k, v)
    query_features, features = (x if x.stride(-1) == 1 else x.contiguous()
                                for x in (query_features, features))
    ranks = q_rank.to(torch.int64).contiguous()
    counts = n_real.to(torch.int64).contiguous()
    table = None if bias is None else bias.detach().contiguous()
    pos = ranks if rank_to_pos is None else rank_to_pos.contiguous()  # unread placeholder
    if out.numel() == 0:
        return out
    n_pages, n_features = features.shape[2], features.shape[3]
    p_block = triton.next_power_of_2(n_pages)
    _best_pages_kernel[(t_q, h_kv, b)](
        q, k, v, query_features, features, ranks if table is None else table, ranks, counts,
        pos, out, scale, page, h // h_kv, d_qk, d_v, n_features, n_pages,
        0 if table is None else table.shape[1], sink_pages, local_pages, n_top, int(causal),
        *strides, query_features.stride(0),
        query_features.stride(1), query_features.stride(2), features.stride(0),
        features.stride(1), features.stride(2), ranks.stride(0), pos.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        HAS_POS=rank_to_pos is not None, HAS_BIAS=table is not None,
        HEAD_FEATURES=features.shape[1] == h, PB=triton.next_power_of_2(page),
        P_BLOCK=p_block,
        FC=max(1, min(triton.next_power_of_2(n_features), FEATURE_ELEMENTS // p_block)),
        **shapes,
    )
    return out
