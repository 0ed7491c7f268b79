"""Sort-based expert matmul (the "grouped" backend) with a hand-written backward.

Forward: stable-sort the slots by expert id, gather each slot's input row once, one GEMM per
expert (``segments.segment_mm``), multiply by the gate and ``index_add_`` straight into the
reduced output, so no per-slot ``[M, K_out]`` output is kept.

Backward: recomputes the gathered input rows instead of saving them. Saved are x, weight, gate,
the sort permutation (``M`` int64) and, only when the gate needs a gradient and
``K_out < K_in``, the ungated per-slot products ``[M, K_out]`` (then the gate gradient
``<grad_out, x @ W_e>`` costs ``M * K_out``; otherwise it is ``<grad_out @ W_e^T, x>`` from the
GEMM that gives dx, ``M * K_in``). Transient buffers are a few ``[M, max(K_in, K_out)]``
tensors. Gradients for x, weight and gate; not twice differentiable.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.expert_matmul.layout import Layout
from attnlab.ops.expert_matmul.segments import row_dots, scatter_rows, segment_mm, segment_outer


class _GroupedExpertMatmul(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x2d: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None, layout: Layout
    ) -> Tensor:
        order = torch.argsort(sel, stable=True)
        counts = torch.bincount(sel, minlength=layout.experts).tolist()
        rows = segment_mm(x2d.index_select(0, order // layout.in_div), weight, counts)
        gate_sorted = None if gate is None else gate.index_select(0, order)
        out = scatter_rows(rows, gate_sorted, order // layout.out_div, layout.out_rows)
        keep_rows = ctx.needs_input_grad[3] and layout.k_out < layout.k_in
        ctx.save_for_backward(x2d, weight, gate, order, rows if keep_rows else None)
        ctx.counts, ctx.layout = counts, layout
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x2d, weight, gate, order, rows = ctx.saved_tensors
        counts, layout = ctx.counts, ctx.layout
        need_x, need_w, _, need_gate, _ = ctx.needs_input_grad
        in_rows = order // layout.in_div
        grad_out = grad_out.reshape(layout.out_rows, layout.k_out)
        grad_rows = grad_out.index_select(0, order // layout.out_div)
        gate_sorted = None if gate is None else gate.index_select(0, order)
        gated = grad_rows if gate_sorted is None else grad_rows * gate_sorted.unsqueeze(1)
        dx = dw = dgate = None
        dots_from_dx = need_gate and rows is None  # gate gradient from the dx GEMM
        x_rows = x2d.index_select(0, in_rows) if need_w or dots_from_dx else None
        if need_w:
            dw = segment_outer(x_rows, gated, counts)
        if dots_from_dx:  # dx rows stay ungated until the scatter
            dx_rows = segment_mm(grad_rows, weight, counts, transpose=True)
            dots = row_dots(dx_rows, x_rows)
            if need_x:
                dx = scatter_rows(dx_rows, gate_sorted, in_rows, x2d.shape[0])
        else:
            if need_gate:
                dots = row_dots(grad_rows, rows)
            if need_x:
                dx_rows = segment_mm(gated, weight, counts, transpose=True)
                dx = scatter_rows(dx_rows, None, in_rows, x2d.shape[0])
        if need_gate:
            dgate = torch.empty_like(gate).index_copy_(0, order, dots.to(gate.dtype))
        return dx, dw, None, dgate, None


def grouped_expert_matmul(
    x: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None, layout: Layout
) -> Tensor:
    """Sort-based path; arguments already validated. Returns ``layout.out_shape``."""
    x2d = x.reshape(-1, layout.k_in)
    flat_gate = None if gate is None else gate.reshape(-1)
    out = _GroupedExpertMatmul.apply(x2d, weight, sel.reshape(-1).long(), flat_gate, layout)
    return out.view(layout.out_shape)
