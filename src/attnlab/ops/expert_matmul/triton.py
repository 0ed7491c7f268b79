"""Triton expert matmul (the "triton" backend): gather, GEMM and gated scatter in one kernel.

Only imported when the backend is used (``import triton`` happens here). Layout: the slots are
stable-sorted by expert and each expert's run is padded to a multiple of ``BLOCK_M``, so a tile
of ``BLOCK_M`` rows belongs to one expert (``tile_expert``; -1 for unused tiles of the static
upper bound ``ceil(M / BLOCK_M) + E``, which avoids a device sync). ``slot[p]`` is the slot at
padded position p, or -1 for padding; a slot reads input row ``slot // in_div`` and writes
output row ``slot // out_div``.

* forward: ``out[slot // out_div] += gate * x[slot // in_div] @ W[e]``, accumulated in fp32
  (fp64 for fp64 inputs) and ``atomic_add``-ed into a buffer of that dtype (plain stores when
  each output row has one slot).
* dx: the same kernel with ``grad_out`` rows and ``W[e]^T``; it also forms the gate gradient
  ``<grad_out @ W[e]^T, x>`` from its accumulator before applying the gate.
* dW: per tile ``x_rows^T @ (gate * grad_rows)``, ``atomic_add``-ed into an fp32 ``[E, K_in,
  K_out]`` buffer, so bf16 inputs get fp32 accumulation across tiles.

No ``[M, K]`` intermediate is formed; saved for backward are x, weight, gate and the slot map.
TF32 is off (``input_precision="ieee"``). Tested under ``TRITON_INTERPRET=1`` on CPU and
compiled on an NVIDIA H200 (fp64, fp32, bf16; tests/test_cuda.py). There, untuned, it is 2-4x
slower than the dense backend (see ``dispatch``), so "auto" never picks it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnlab.ops.expert_matmul.grouped import grouped_expert_matmul
from attnlab.ops.expert_matmul.layout import Layout

BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 32
_TL_ACC = {torch.float32: tl.float32, torch.float64: tl.float64}


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulator (and output buffer) dtype: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@triton.jit
def _gather_mm_scatter_kernel(
    a_ptr, b_ptr, out_ptr, slot_ptr, tile_expert_ptr, scale_ptr, c_ptr, dot_ptr,
    K, N, src_div, dst_div,
    stride_am, stride_be, stride_bk, stride_bn, stride_om, stride_cm,
    HAS_SCALE: tl.constexpr, HAS_DOT: tl.constexpr, ATOMIC: tl.constexpr, ACC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """``out[slot // dst_div] (+)= scale[slot] * a[slot // src_div] @ b[e]`` for one tile and
    one block of output columns; with HAS_DOT also ``dot[slot] += <unscaled row, c[dst]>``."""
    tile = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + tile)
    if expert >= 0:
        slot = tl.load(slot_ptr + tile * BM + tl.arange(0, BM))
        valid = slot >= 0
        src = tl.where(valid, slot // src_div, 0)
        dst = tl.where(valid, slot // dst_div, 0)
        offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
        n_ok = offs_n < N
        acc = tl.zeros((BM, BN), dtype=ACC)
        for k0 in range(0, K, BK):
            offs_k = k0 + tl.arange(0, BK)
            k_ok = offs_k < K
            a = tl.load(a_ptr + src[:, None] * stride_am + offs_k[None, :],
                        mask=valid[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptr + expert * stride_be + offs_k[:, None] * stride_bk
                        + offs_n[None, :] * stride_bn,
                        mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc += tl.dot(a, b, input_precision="ieee", out_dtype=ACC)
        mask = valid[:, None] & n_ok[None, :]
        if HAS_DOT:
            c = tl.load(c_ptr + dst[:, None] * stride_cm + offs_n[None, :], mask=mask, other=0.0)
            tl.atomic_add(dot_ptr + slot, tl.sum(acc * c.to(ACC), axis=1), mask=valid)
        if HAS_SCALE:
            acc = acc * tl.load(scale_ptr + slot, mask=valid, other=0.0).to(ACC)[:, None]
        ptrs = out_ptr + dst[:, None] * stride_om + offs_n[None, :]
        if ATOMIC:
            tl.atomic_add(ptrs, acc, mask=mask)
        else:
            tl.store(ptrs, acc, mask=mask)


@triton.jit
def _segment_outer_kernel(
    a_ptr, g_ptr, scale_ptr, dw_ptr, slot_ptr, tile_expert_ptr,
    K, N, a_div, g_div, stride_am, stride_gm, stride_de, stride_dk,
    HAS_SCALE: tl.constexpr, ACC: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    """``dw[e] += a[rows]^T @ (scale * g[rows])`` for one tile and one ``[BK, BN]`` block."""
    tile = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + tile)
    if expert >= 0:
        slot = tl.load(slot_ptr + tile * BM + tl.arange(0, BM))
        valid = slot >= 0
        offs_k = tl.program_id(1) * BK + tl.arange(0, BK)
        offs_n = tl.program_id(2) * BN + tl.arange(0, BN)
        k_ok, n_ok = offs_k < K, offs_n < N
        a_rows = tl.where(valid, slot // a_div, 0)
        g_rows = tl.where(valid, slot // g_div, 0)
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + offs_k[None, :],
                    mask=valid[:, None] & k_ok[None, :], other=0.0)
        g = tl.load(g_ptr + g_rows[:, None] * stride_gm + offs_n[None, :],
                    mask=valid[:, None] & n_ok[None, :], other=0.0)
        if HAS_SCALE:
            scale = tl.load(scale_ptr + slot, mask=valid, other=0.0).to(ACC)
            g = (g.to(ACC) * scale[:, None]).to(a.dtype)
        acc = tl.dot(tl.trans(a), g, input_precision="ieee", out_dtype=ACC)
        ptrs = dw_ptr + expert * stride_de + offs_k[:, None] * stride_dk + offs_n[None, :]
        tl.atomic_add(ptrs, acc, mask=k_ok[:, None] & n_ok[None, :])


def _tile_map(sel: Tensor, experts: int) -> tuple[Tensor, Tensor]:
    """``(slot [n_tiles * BLOCK_M], tile_expert [n_tiles])`` for flat ids ``sel [M]``."""
    m = sel.numel()
    n_tiles = triton.cdiv(m, BLOCK_M) + experts
    order = torch.argsort(sel, stable=True)
    counts = torch.bincount(sel, minlength=experts)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_end = torch.cumsum(tiles, 0)
    tile_expert = torch.searchsorted(tile_end, torch.arange(n_tiles, device=sel.device), right=True)
    tile_expert = torch.where(tile_expert < experts, tile_expert, -1).to(torch.int32)
    sorted_ids = sel[order]
    seg_start = torch.cumsum(counts, 0) - counts
    pos = (tile_end - tiles)[sorted_ids] * BLOCK_M + torch.arange(m, device=sel.device)
    pos -= seg_start[sorted_ids]
    slot = torch.full((n_tiles * BLOCK_M,), -1, dtype=torch.int64, device=sel.device)
    slot[pos] = order
    return slot, tile_expert


def _product(
    a: Tensor, src_div: int, b: Tensor, transpose_b: bool, out: Tensor, dst_div: int,
    slot: Tensor, tile_expert: Tensor, scale: Tensor | None,
    dot: tuple[Tensor, Tensor] | None = None,
) -> None:
    """Launch ``_gather_mm_scatter_kernel``: a ``[rows, K]``, b ``[E, K, N]`` (or ``[E, N, K]``
    with ``transpose_b``), out fp32 ``[rows', N]``; dot = ``(c [rows', N], dot fp32 [M])``."""
    k, n = (b.shape[2], b.shape[1]) if transpose_b else (b.shape[1], b.shape[2])
    stride_bk, stride_bn = (b.stride(2), b.stride(1)) if transpose_b else b.stride()[1:]
    c, dot_out = dot if dot is not None else (out, out)
    grid = (tile_expert.numel(), triton.cdiv(n, BLOCK_N))
    _gather_mm_scatter_kernel[grid](
        a, b, out, slot, tile_expert, scale if scale is not None else out, c, dot_out,
        k, n, src_div, dst_div,
        a.stride(0), b.stride(0), stride_bk, stride_bn, out.stride(0), c.stride(0),
        HAS_SCALE=scale is not None, HAS_DOT=dot is not None, ATOMIC=dst_div != 1,
        ACC=_TL_ACC[out.dtype],
        BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
    )


class _TritonExpertMatmul(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x2d: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None, layout: Layout
    ) -> Tensor:
        slot, tile_expert = _tile_map(sel, layout.experts)
        acc = _acc_dtype(x2d.dtype)
        out = torch.zeros(layout.out_rows, layout.k_out, dtype=acc, device=x2d.device)
        _product(x2d, layout.in_div, weight, False, out, layout.out_div, slot, tile_expert, gate)
        ctx.save_for_backward(x2d, weight, gate, slot, tile_expert)
        ctx.layout = layout
        return out.to(x2d.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x2d, weight, gate, slot, tile_expert = ctx.saved_tensors
        layout: Layout = ctx.layout
        need_x, need_w, _, need_gate, _ = ctx.needs_input_grad
        grad2d = grad_out.reshape(layout.out_rows, layout.k_out).contiguous()
        acc = _acc_dtype(x2d.dtype)
        dx = dw = dgate = None
        if need_x or need_gate:
            dx_acc = torch.zeros(x2d.shape, dtype=acc, device=x2d.device)
            dot = None
            if need_gate:
                dot = (x2d, torch.zeros(layout.slots, dtype=acc, device=x2d.device))
            _product(grad2d, layout.out_div, weight, True, dx_acc, layout.in_div, slot,
                     tile_expert, gate, dot)
            dx = dx_acc.to(x2d.dtype) if need_x else None
            dgate = dot[1].to(gate.dtype) if dot is not None else None
        if need_w:
            dw_acc = torch.zeros(weight.shape, dtype=acc, device=weight.device)
            grid = (tile_expert.numel(), triton.cdiv(layout.k_in, BLOCK_K),
                    triton.cdiv(layout.k_out, BLOCK_N))
            _segment_outer_kernel[grid](
                x2d, grad2d, gate if gate is not None else grad2d, dw_acc, slot, tile_expert,
                layout.k_in, layout.k_out, layout.in_div, layout.out_div,
                x2d.stride(0), grad2d.stride(0), dw_acc.stride(0), dw_acc.stride(1),
                HAS_SCALE=gate is not None, ACC=_TL_ACC[acc], BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
            )
            dw = dw_acc.to(weight.dtype)
        return dx, dw, None, dgate, None


def triton_expert_matmul(
    x: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None, layout: Layout
) -> Tensor:
    """Triton path; arguments already validated. Returns ``layout.out_shape``. Calls without
    slots (N = 0) go to the grouped path: there is nothing to launch."""
    if layout.slots == 0:
        return grouped_expert_matmul(x, weight, sel, gate, layout)
    x2d = x.reshape(-1, layout.k_in).contiguous()
    flat_gate = None if gate is None else gate.reshape(-1).contiguous()
    out = _TritonExpertMatmul.apply(x2d, weight, sel.reshape(-1).long(), flat_gate, layout)
    return out.view(layout.out_shape)
