"""``expert_matmul``: validation, then the chosen backend.

``backend="auto"`` (``choose_backend``) runs "dense" when its MAC overhead ``dense_mac_ratio``
(``E / (G * k)``, or ``E / k`` for per-group input not reduced over groups) is at most the
device's ``DENSE_MAX_RATIO``, else "grouped" (which itself pads to one bmm or loops over
experts, by the routing it sees: ``segments.PAD_MAX_WASTE``). "triton" runs only when asked
for: on an H200 it is the slowest of the three (below).

Measurements behind the threshold (2-core AMD EPYC, torch 2.13 CPU, 2 threads; SwitchHead-style
routing, so "grouped" ran padded; dense time / grouped time, so < 1 means dense is faster; the
machine was shared and loaded, so process CPU time, min of 7-11 alternated reps, wall-clock
minima agreeing; "V": [N, 412] -> [N, G, 76] reduce slots, "O": [N, G, 76] -> [N, 412] reduce
all, G = k = 2, N = 4096 unless said)::

    MAC ratio               1.5        2.0        2.5        4.0
    fp32 fwd       V / O    0.65/0.67  0.84/0.85  0.95/1.02  1.65/1.58
    fp32 fwd+bwd   V / O    0.69/0.78  0.99/0.93  1.11/1.37  1.93/2.15
    fp32 fwd+bwd N=1024     -          0.81/0.76  0.92/1.35  -
    bf16 fwd+bwd   V / O    1.07/1.04  1.44/1.51  1.79/1.60  -

The tiny SwitchHead (d_model 128, d_head 28, 2 heads x 4 experts: ratio 2.0) prefers dense
clearly: fp32 fwd+bwd 0.86/0.83 at N=2048 and 0.70/0.77 at N=4096, fwd 0.47-0.59; bf16 0.61/0.61.
So the threshold stays 2.0 for every dtype, although bf16 at the 47M widths ties at 1.5 and
would prefer grouped at 2.0 (a size- and dtype-dependent rule was not worth it). At 2.5
(SwitchHead 47M) grouped wins fwd+bwd and ties the forward.

On CUDA (NVIDIA H200, torch 2.11, bf16, N = 65536, ratio 2.5, medians of 10 alternated reps;
docs/results/gpu-h200/bench-expert-matmul-h200.json), ms fwd / fwd+bwd::

           dense       grouped     triton      (one plain matmul of the useful MACs)
    V      0.87/2.01   1.55/3.83   1.78/8.40   0.21/0.85
    O      0.89/2.01   2.18/3.62   2.91/7.56   0.20/0.86

Dense is 1.8-2.4x faster than grouped at 2.5x the MACs, so it stays ahead up to a MAC overhead
of about 4.5 if grouped ran at the matmul's own rate: the CUDA threshold is 4.0, measured only
at 2.5. The Triton kernel (32x32x32 tiles, atomic scatter, untuned) is correct on the GPU
(tests/test_cuda.py) but 2-4x slower than dense.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.expert_matmul import segments
from attnlab.ops.expert_matmul.dense import dense_expert_matmul, dense_mac_ratio
from attnlab.ops.expert_matmul.grouped import grouped_expert_matmul
from attnlab.ops.expert_matmul.layout import REDUCTIONS, Layout, check_inputs
from attnlab.ops.expert_matmul.naive import expert_matmul_naive

BACKENDS = ("auto", "grouped", "dense", "naive", "triton")
DENSE_MAX_RATIO = {"cpu": 2.0, "cuda": 4.0}
"""Per device type, the largest dense/useful MAC ratio at which "auto" picks the dense backend
(see the module docstring); other device types use the CPU's."""


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def choose_backend(layout: Layout, device: torch.device) -> str:
    """The backend that ``backend="auto"`` runs for a call of this layout on this device."""
    limit = DENSE_MAX_RATIO.get(device.type, DENSE_MAX_RATIO["cpu"])
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

    ``backend``: "auto" (see ``choose_backend``), "grouped" (sort, then one padded bmm or,
    for very imbalanced routing, one GEMM per expert),
    "dense" (all-experts GEMMs), "naive" (the reference) or "triton" (CUDA, or CPU under
    ``TRITON_INTERPRET=1``). ``check=False`` skips the value range check of ``sel`` (a min/max
    reduction; on CUDA also a host sync). Out-of-range ids are then undefined behaviour.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    layout = check_inputs(x, weight, sel, gate, reduce, check)
    if backend == "auto":
        backend = choose_backend(layout, x.device)
    if backend == "naive":
        return expert_matmul_naive(x, weight, sel, gate, reduce=reduce)
    if backend == "dense":
        return dense_expert_matmul(x, weight, sel, gate, layout)
    if backend == "triton":
        return _triton_backend(x.device)(x, weight, sel, gate, layout)
    return grouped_expert_matmul(x, weight, sel, gate, layout)


def _example(gen: torch.Generator, *, backend: str = "grouped", per_group: bool = False,
             reduce: str = "slots", gated: bool = True, n: int = 11, routing: str = "top-k"
             ) -> contract.Example:
    """3 groups of 2 slots over 7 experts, 5 -> 6 features. ``routing``: ``"top-k"`` (ids
    distinct within a group, as a router's), ``"imbalanced"`` (expert 0 in every group),
    ``"unused"`` (experts 1, 2, 4 and 6 get nothing) or ``"duplicate"`` (one id twice)."""
    groups, k, experts, k_in, k_out = 3, 2, 7, 5, 6
    x = contract.normal(gen, *((n, groups, k_in) if per_group else (n, k_in)))
    sel = torch.rand(n, groups, experts, generator=gen).topk(k, dim=-1).indices
    if routing == "imbalanced":
        sel[..., 0] = 0
        sel[..., 1] = torch.randint(1, experts, (n, groups), generator=gen)
    elif routing == "unused":
        sel = torch.tensor([0, 3, 5])[sel % 3]
    elif routing == "duplicate":
        sel[..., 1] = sel[..., 0]
    shape = {"none": (n, groups, k, k_out), "slots": (n, groups, k_out), "all": (n, k_out)}
    return contract.Example(
        {"x": x, "weight": contract.normal(gen, experts, k_in, k_out) / k_in**0.5, "sel": sel,
         "gate": torch.rand(n, groups, k, generator=gen, dtype=torch.float64) if gated else None,
         "reduce": reduce},
        shape[reduce], options={"backend": backend})


_PLANS = {"padded": float("inf"), "ragged": 0.0}
"""The grouped backend's plans, forced by ``segments.PAD_MAX_WASTE``."""

contract.register(contract.OpContract(
    "expert_matmul", expert_matmul, expert_matmul_naive, _example,
    cases=(
        *contract.grid(backend=("dense",), per_group=(False, True), reduce=REDUCTIONS),
        *(case for plan, waste in _PLANS.items()
          for case in contract.grid(
              label=plan, patches=((f"{segments.__name__}.PAD_MAX_WASTE", waste),),
              backend=("grouped",), per_group=(False, True), reduce=REDUCTIONS)),
        *contract.grid(backend=("auto",), gated=(False, True)),
        *contract.grid(routing=("imbalanced", "unused", "duplicate"), per_group=(True,)),
        *contract.grid(n=(0, 1), reduce=REDUCTIONS),
    ),
    grads=("x", "weight", "gate"),
    low_precision=contract.FLOAT32,
))
