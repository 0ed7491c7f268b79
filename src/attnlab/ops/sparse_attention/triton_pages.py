"""The Triton executor of a page selection: exact attention over the selected pages, the
selection read as a block table (as a paged KV cache's), no host in the loop.

Only imported when the executor runs (``import triton`` happens here; callers go through
:func:`attnlab.ops.sparse_attention.pages.attend_pages_triton`). One program per (query row,
KV head, batch row) holds the query heads of its KV group, walks the row's selected page
slots (``PageSelection.pages``, -1 = unused) and keeps an online softmax over their keys
(ranks below the row's ``limit``, mapped to positions by ``rank_to_pos`` under padding), so
it reads ``budget`` keys and values per KV head and nothing else. The products are
elementwise sums rather than ``tl.dot``: a decoding row has a handful of heads, and the
interpreter's ``tl.dot`` is wrong in bfloat16. Accumulates in float32 (float64 for float64
inputs). Forward only: no gradients (the executors' chooser never sends it a call that
needs them).

Every shape is fixed by the inputs' shapes (the slots are padded to the budget), so a call
reads nothing back to the host. Tested on CPU under ``TRITON_INTERPRET=1``
(tests/ops/test_triton_pages.py) and written for CUDA; ``scripts/gpu-check.sh`` runs it on a
GPU when one is lent.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnlab.ops.sparse_attention.pages import PageSelection

_TL_ACC = {torch.float32: tl.float32, torch.float64: tl.float64}


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
    g = tl.arange(0, G)
    heads = h * group + g
    d = tl.arange(0, D)
    dv = tl.arange(0, DV)
    j = tl.arange(0, PB)
    q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + t * sq_t + d[None, :],
                mask=(g[:, None] < group) & (d[None, :] < d_qk), other=0.0).to(ACC)
    limit = tl.load(limit_ptr + b * sl_b + t)
    m = tl.full([G], float("-inf"), ACC)
    total = tl.zeros([G], ACC)
    acc = tl.zeros([G, DV], ACC)
    for s in range(0, n_slots):
        p = tl.load(pages_ptr + b * sp_b + h * sp_h + t * sp_t + s)
        ranks = p * page + j  # an unused slot (p = -1): all negative
        read = (j < page) & (ranks >= 0) & (ranks < limit)
        if HAS_POS:
            at = tl.load(pos_ptr + b * spos_b + ranks, mask=read, other=0)
        else:
            at = ranks
        keys = tl.load(k_ptr + b * sk_b + h * sk_h + at[:, None] * sk_t + d[None, :],
                       mask=read[:, None] & (d[None, :] < d_qk), other=0.0).to(ACC)
        scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [G, PB]
        scores = tl.where(read[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: keep zeros
        probs = tl.exp(scores - shift[:, None])
        decay = tl.exp(m - shift)
        values = tl.load(v_ptr + b * sv_b + h * sv_h + at[:, None] * sv_t + dv[None, :],
                         mask=read[:, None] & (dv[None, :] < d_v), other=0.0).to(ACC)
        total = total * decay + tl.sum(probs, axis=1)
        acc = acc * decay[:, None] + tl.sum(probs[:, :, None] * values[None, :, :], axis=1)
        m = m_new
    out = tl.where(total[:, None] > 0, acc / tl.where(total > 0, total, 1.0)[:, None], 0.0)
    tl.store(out_ptr + b * so_b + heads[:, None] * so_h + t * so_t + dv[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(g[:, None] < group) & (dv[None, :] < d_v))


def attend_pages_kernel(q: Tensor, k: Tensor, v: Tensor, selection: PageSelection, *,
                        scale: float) -> Tensor:
    """:func:`~attnlab.ops.sparse_attention.pages.attend_pages` by the Triton kernel: q
    ``[B, H, Tq, D]``, k, v ``[B, Hk, Tk, D]`` (one dtype; CUDA, or CPU under
    ``TRITON_INTERPRET=1``) -> ``[B, H, Tq, Dv]`` in q's dtype (0 for a row that reads none).
    """
    b, h, t_q, d_qk = q.shape
    h_kv, d_v = k.shape[1], v.shape[-1]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    pages = selection.pages.contiguous()
    limit = selection.limit.contiguous()
    pos = selection.rank_to_pos
    pos = limit if pos is None else pos.contiguous()  # an unread placeholder without padding
    out = torch.empty(b, h, t_q, d_v, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    _selected_pages_kernel[(t_q, h_kv, b)](
        q, k, v, pages, limit, pos, out,
        scale, pages.shape[-1], selection.page, h // h_kv, d_qk, d_v,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), pages.stride(0), pages.stride(1),
        pages.stride(2), limit.stride(0), pos.stride(0), out.stride(0), out.stride(1),
        out.stride(2),
        HAS_POS=selection.rank_to_pos is not None, ACC=_TL_ACC.get(q.dtype, tl.float32),
        G=triton.next_power_of_2(h // h_kv), PB=triton.next_power_of_2(selection.page),
        D=triton.next_power_of_2(d_qk), DV=triton.next_power_of_2(d_v),
    )
    return out
