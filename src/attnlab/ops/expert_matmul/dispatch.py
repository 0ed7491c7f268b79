"""``expert_matmul``: validation, then the chosen backend.

Backend choice of ``backend="auto"`` (``choose_backend``):

* CUDA tensors with triton importable: "triton".
* otherwise "dense" when its MAC overhead ``dense_mac_ratio`` (``E / (G * k)``, or ``E / k``
  for per-group input not reduced over groups) is at most ``DENSE_MAX_RATIO`` for the dtype,
  else "grouped".

MEASURED: see ``DENSE_MAX_RATIO``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable

import torch
from torch import Tensor

from attnlab.ops.expert_matmul.dense import dense_expert_matmul, dense_mac_ratio
from attnlab.ops.expert_matmul.grouped import grouped_expert_matmul
from attnlab.ops.expert_matmul.layout import Layout, check_inputs
from attnlab.ops.expert_matmul.naive import expert_matmul_naive

BACKENDS = ("auto", "grouped", "dense", "naive", "triton")
DENSE_MAX_RATIO = {torch.float32: 2.0, torch.bfloat16: 2.0}
"""Largest dense/useful MAC ratio at which "auto" picks the dense backend, per dtype
(other dtypes use the float32 entry). PLACEHOLDER until measured."""


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def choose_backend(layout: Layout, device: torch.device, dtype: torch.dtype) -> str:
    """The backend that ``backend="auto"`` runs for a call of this layout, device and dtype."""
    if device.type == "cuda" and triton_available():
        return "triton"
    limit = DENSE_MAX_RATIO.get(dtype, DENSE_MAX_RATIO[torch.float32])
    return "dense" if dense_mac_ratio(layout) <= limit else "grouped"


def _triton_backend(
    device: torch.device,
) -> Callable[[Tensor, Tensor, Tensor, Tensor | None, Layout], Tensor]:
    """The Triton implementation, imported on first use (importing it imports triton)."""
    if not triton_available():
        raise RuntimeError("backend='triton' needs triton: pip install 'attnlab[triton]'")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)")
    from attnlab.ops.expert_matmul.triton import triton_expert_matmul

    return triton_expert_matmul


def expert_matmul(
    x: Tensor,
    weight: Tensor,
    sel: Tensor,
    gate: Tensor | None = None,
    *,
    reduce: str = "slots",
    backend: str = "auto",
    check: bool = True,
) -> Tensor:
    """Multiply each row by the expert matrices its slots select, gate, and reduce.

    ``out[n, g, j] = gate[n, g, j] * x[n(, g)] @ weight[sel[n, g, j]]``.

    Shapes: x ``[N, K_in]`` (every group reads row n) or ``[N, G, K_in]`` (group g reads
    ``x[n, g]``); weight ``[E, K_in, K_out]``, contiguous; sel integer ``[N, G, k]`` in
    ``[0, E)``; gate ``[N, G, k]`` or None (weight 1). Returns ``[N, G, k, K_out]`` for
    ``reduce="none"``, ``[N, G, K_out]`` for "slots" (sum over j), ``[N, K_out]`` for "all"
    (sum over g and j). Differentiable in x, weight and gate (once).

    ``backend``: "auto" (see ``choose_backend``), "grouped" (sort + per-expert GEMMs),
    "dense" (all-experts GEMMs), "naive" (the reference) or "triton" (CUDA, or CPU under
    ``TRITON_INTERPRET=1``). ``check=False`` skips the value range check of ``sel`` (a min/max
    reduction; on CUDA also a host sync). Out-of-range ids are then undefined behaviour.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    layout = check_inputs(x, weight, sel, gate, reduce, check)
    if backend == "auto":
        backend = choose_backend(layout, x.device, x.dtype)
    if backend == "naive":
        return expert_matmul_naive(x, weight, sel, gate, reduce=reduce)
    if backend == "dense":
        return dense_expert_matmul(x, weight, sel, gate, layout)
    if backend == "triton":
        return _triton_backend(x.device)(x, weight, sel, gate, layout)
    return grouped_expert_matmul(x, weight, sel, gate, layout)
