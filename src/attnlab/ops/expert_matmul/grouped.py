"""Sort-based expert matmul (the "grouped" backend) with a hand-written backward.

Forward: ``segments.plan_segments`` stable-sorts the slots by expert and lays each expert's
rows out as one segment, padded to a common length (one ``bmm`` for all experts) unless the
routing is so imbalanced that padding would add more than 20 % rows (then one ``mm`` per
expert; ``segments.PAD_MAX_WASTE`` and its measurements); gather each slot's input row once,
GEMM, ``index_add_`` straight into the reduced output, so no per-slot output is kept.

The gate multiplies the narrower side of each GEMM: the input rows when ``K_in <= K_out``
(SwitchHead's O), the output rows otherwise (V), so no ``[M, K_wide]`` tensor is scaled.

Backward: recomputes the gathered input rows instead of saving them. Saved are x, weight, gate,
the slot map (int64: ``P`` slot per position, ``M`` position per slot, ``P - M`` pad positions;
``P <= PAD_MAX_WASTE * M`` padded, ``M`` ragged) and, only when the gate needs a gradient and
``K_out < K_in``, the ungated per-slot products ``[P, K_out]`` (then the gate gradient
``<grad_out, x @ W_e>`` costs ``P * K_out``; otherwise it is ``<grad_out @ W_e^T, x>`` from the
GEMM that gives dx, ``P * K_in``). Transient buffers are a few ``[P, K_in or K_out]``
tensors, at most one ``[P, max(K_in, K_out)]`` at a time. Gradients for x, weight and gate;
not twice differentiable.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.expert_matmul.layout import Layout
from attnlab.ops.expert_matmul.segments import (
    Segments,
    gather_rows,
    plan_segments,
    row_dots,
    scatter_rows,
    segment_mm,
    segment_outer,
)


def _gated_(rows: Tensor, gate_p: Tensor | None) -> Tensor:
    """``rows * gate_p[:, None]`` in place (rows is a private buffer), or rows when ungated."""
    return rows if gate_p is None else rows.mul_(gate_p.unsqueeze(1))


class _GroupedExpertMatmul(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x2d: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None, layout: Layout
    ) -> Tensor:
        seg = plan_segments(sel, layout.experts)
        gate_in = layout.k_in <= layout.k_out  # the gate scales the input rows
        gate_p = None if gate is None else gate.index_select(0, seg.slot)
        x_rows = gather_rows(x2d, seg.slot // layout.in_div, seg)
        rows = segment_mm(_gated_(x_rows, gate_p if gate_in else None), weight, seg)
        out_scale = None if gate_in else gate_p
        out = scatter_rows(rows, out_scale, seg.slot // layout.out_div, layout.out_rows, seg)
        keep_rows = ctx.needs_input_grad[3] and not gate_in  # then out_scale left rows alone
        ctx.save_for_backward(
            x2d, weight, gate, seg.slot, seg.pos, seg.pads, rows if keep_rows else None
        )
        ctx.lengths, ctx.layout = seg.lengths, layout
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x2d, weight, gate, slot, pos, pads, rows = ctx.saved_tensors
        seg, layout = Segments(slot, pos, pads, ctx.lengths), ctx.layout
        need_x, need_w, _, need_gate, _ = ctx.needs_input_grad
        in_index = slot // layout.in_div
        grad_out = grad_out.reshape(layout.out_rows, layout.k_out)
        grad_rows = gather_rows(grad_out, slot // layout.out_div, seg)
        gate_p = None if gate is None else gate.index_select(0, slot)
        dx = dw = dgate = dots = None
        if layout.k_in <= layout.k_out:  # the gate acts on the input side
            x_rows = gather_rows(x2d, in_index, seg) if need_w or need_gate else None
            dx_rows = segment_mm(grad_rows, weight, seg, True) if need_x or need_gate else None
            if need_gate:
                dots = row_dots(dx_rows, x_rows)
            if need_w:
                dw = segment_outer(_gated_(x_rows, gate_p), grad_rows, seg)  # after the dots
            if need_x:
                dx = scatter_rows(dx_rows, gate_p, in_index, x2d.shape[0], seg)
        else:  # the gate acts on the output side; ungated products were saved
            if need_gate:
                dots = row_dots(grad_rows, rows)
            gated = _gated_(grad_rows, gate_p)  # after the dots
            x_rows = gather_rows(x2d, in_index, seg) if need_w else None
            if need_w:
                dw = segment_outer(x_rows, gated, seg)
            if need_x:  # dx rows reuse the [P, K_in] buffer of x_rows (a fresh one page-faults)
                dx_rows = segment_mm(gated, weight, seg, transpose=True, out=x_rows)
                dx = scatter_rows(dx_rows, None, in_index, x2d.shape[0], seg)
        if need_gate:
            dgate = dots.index_select(0, pos).to(gate.dtype)
        return dx, dw, None, dgate, None


def grouped_expert_matmul(
    x: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None, layout: Layout
) -> Tensor:
    """Sort-based path; arguments already validated. Returns ``layout.out_shape``."""
    x2d = x.reshape(-1, layout.k_in)
    flat_gate = None if gate is None else gate.reshape(-1)
    out = _GroupedExpertMatmul.apply(x2d, weight, sel.reshape(-1).long(), flat_gate, layout)
    return out.view(layout.out_shape)
