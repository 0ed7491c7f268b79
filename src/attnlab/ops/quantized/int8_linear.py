"""Weight-only int8 linear maps: ``y = x (q * scale[:, None])^T + bias``, the weight stored as
int8 ``q [N, K]`` with one float scale per output channel (symmetric, round to nearest).

Decoding a small model is bound by reading its weights: int8 reads a quarter of float32's bytes
and half of bfloat16's. :func:`int8_linear` multiplies by the int8 weight directly with torch's
CPU kernel (``_weight_int8pack_mm``) when it applies (CPU, activations in float32, bfloat16 or
float16, an input width that is a multiple of :data:`KERNEL_WIDTH_MULTIPLE`, at least one row,
no gradient asked for); elsewhere it is :func:`int8_linear_naive`, which dequantizes first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.ops import contract

INT8_MAX = 127
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNEL_WIDTH_MULTIPLE = 16
"""torch 2.13's kernel returns garbage in bfloat16 for other input widths (inf at 40, 8) and
crashes on some, and it crashes on zero rows: tested shapes only."""


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """``weight [N, K]`` -> (int8 ``q [N, K]``, ``scale [N]`` in ``weight``'s dtype):
    ``scale = max |row| / 127`` (1 for a zero row) and ``q = round(weight / scale)``, so
    ``q * scale`` is within ``scale / 2`` of ``weight``."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be [out, in], got shape {tuple(weight.shape)}")
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale.to(weight.dtype)


def int8_linear_naive(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None
                      ) -> Tensor:
    """Reference of :func:`int8_linear`: dequantize ``q [N, K]`` to ``x``'s dtype, then
    ``F.linear``. ``x [..., K]`` -> ``[..., N]``."""
    weight = q.to(x.dtype) * scale.to(x.dtype)[:, None]
    return F.linear(x, weight, None if bias is None else bias.to(x.dtype))


def _kernel_applies(x: Tensor, scale: Tensor, bias: Tensor | None) -> bool:
    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, scale, bias))
    return (x.device.type == "cpu" and x.dtype in KERNEL_DTYPES and x.numel() > 0
            and x.shape[-1] % KERNEL_WIDTH_MULTIPLE == 0 and not wants_grad)


def int8_linear(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x [..., K]`` times the int8 weight ``q [N, K]`` with per-row ``scale [N]``, plus
    ``bias [N]``: ``[..., N]`` in ``x``'s dtype (see the module's docstring for the path)."""
    if not _kernel_applies(x, scale, bias):
        return int8_linear_naive(x, q, scale, bias)
    flat = x.reshape(-1, x.shape[-1])
    if not flat.is_contiguous():
        flat = flat.contiguous()
    out = torch._weight_int8pack_mm(flat, q, scale.to(x.dtype))
    if bias is not None:
        out = out + bias.to(x.dtype)
    return out.reshape(*x.shape[:-1], q.shape[0])


def _example(gen: torch.Generator, *, rows: tuple[int, ...], biased: bool, k: int,
             n: int = 24) -> contract.Example:
    """Normal ``x [*rows, k]`` and a quantized normal ``[n, k]`` weight (its scale float64)."""
    q, scale = quantize_int8(contract.normal(gen, n, k))
    bias = contract.normal(gen, n) if biased else None
    return contract.Example({"x": contract.normal(gen, *rows, k), "q": q, "scale": scale,
                             "bias": bias}, (*rows, n))


contract.register(contract.OpContract(
    "int8_linear", int8_linear, int8_linear_naive, _example,
    cases=(*contract.grid(rows=((1,), (5,), (2, 3), (0,)), biased=(False, True), k=(48,)),
           contract.Case("width-off-the-kernel", {"rows": (3,), "biased": True, "k": 40})),
    grads=("x", "scale", "bias"),
    low_precision=contract.FLOAT32_BFLOAT16,
))
