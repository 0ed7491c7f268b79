"""Argument checks for the expert matmul and the index arithmetic every backend shares.

Slots are numbered in row-major order of ``sel``: slot ``m = (n * G + g) * k + j``. A slot reads
input row ``m // in_div`` of ``x`` viewed as 2-D and adds into output row ``m // out_div`` of the
output viewed as 2-D; ``Layout`` gives both divisors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

REDUCTIONS = ("none", "slots", "all")


@dataclass(frozen=True)
class Layout:
    """Sizes of one call. ``per_group_input``: x is ``[N, G, K_in]`` rather than ``[N, K_in]``."""

    n: int
    groups: int
    k: int
    experts: int
    k_in: int
    k_out: int
    per_group_input: bool
    reduce: str

    @property
    def slots(self) -> int:
        """Number of (row, group, slot) products, ``M = N * G * k``."""
        return self.n * self.groups * self.k

    @property
    def in_div(self) -> int:
        """Slot ``m`` reads row ``m // in_div`` of x viewed as ``[N or N*G, K_in]``."""
        return self.k if self.per_group_input else self.groups * self.k

    @property
    def out_div(self) -> int:
        """Slot ``m`` adds into row ``m // out_div`` of the output viewed as 2-D."""
        return {"none": 1, "slots": self.k, "all": self.groups * self.k}[self.reduce]

    @property
    def out_rows(self) -> int:
        """Rows of the output viewed as ``[rows, K_out]``."""
        return self.slots // self.out_div

    @property
    def out_shape(self) -> tuple[int, ...]:
        """``[N, G, k, K_out]``, ``[N, G, K_out]`` or ``[N, K_out]`` for none / slots / all."""
        if self.reduce == "none":
            return (self.n, self.groups, self.k, self.k_out)
        if self.reduce == "slots":
            return (self.n, self.groups, self.k_out)
        return (self.n, self.k_out)


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_inputs(
    x: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None, reduce: str, check: bool
) -> Layout:
    """Validate the arguments of ``expert_matmul`` and return their ``Layout``.

    Shapes: x ``[N, K_in]`` or ``[N, G, K_in]``; weight ``[E, K_in, K_out]`` (contiguous);
    sel integer ``[N, G, k]`` with values in ``[0, E)``; gate ``[N, G, k]`` or None. Raises
    ``ValueError`` naming the problem. ``check=False`` skips the value range check of ``sel``
    (a min/max reduction, and a device sync on CUDA); every other check only reads metadata.
    Duplicate ids inside a group are allowed (their products are summed); ``k > E`` is refused
    because a top-k over ``E`` experts cannot produce it, so it signals a mislaid dimension.
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be [N, K_in] or [N, G, K_in], got shape {_shape(x)}")
    if weight.dim() != 3:
        raise ValueError(f"weight must be [E, K_in, K_out], got shape {_shape(weight)}")
    if sel.dim() != 3:
        raise ValueError(f"sel must be [N, G, k], got shape {_shape(sel)}")
    if sel.dtype.is_floating_point or sel.dtype.is_complex or sel.dtype == torch.bool:
        raise ValueError(f"sel must be an integer tensor of expert ids, got {sel.dtype}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point tensor, got {x.dtype}")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight dtype {weight.dtype} does not match x dtype {x.dtype}")
    if gate is not None and gate.dtype != x.dtype:
        raise ValueError(f"gate dtype {gate.dtype} does not match x dtype {x.dtype}")
    if not weight.is_contiguous():
        raise ValueError(
            f"weight must be contiguous [E, K_in, K_out]; got strides {weight.stride()} for shape "
            f"{_shape(weight)} (a transposed view? call .contiguous() once, outside the hot loop)"
        )
    tensors = [x, weight, sel] + ([] if gate is None else [gate])
    if len({t.device for t in tensors}) > 1:
        devices = [str(t.device) for t in tensors]
        raise ValueError(f"x, weight, sel and gate must be on one device, got {devices}")

    n, groups, k = sel.shape
    experts, k_in, k_out = weight.shape
    if x.shape[0] != n:
        raise ValueError(f"x has {x.shape[0]} rows but sel has N={n} (sel {_shape(sel)})")
    if x.dim() == 3 and x.shape[1] != groups:
        raise ValueError(f"x has {x.shape[1]} groups but sel has G={groups} (sel {_shape(sel)})")
    if x.shape[-1] != k_in:
        raise ValueError(
            f"x feature size {x.shape[-1]} != weight K_in={k_in} (weight {_shape(weight)})"
        )
    if gate is not None and gate.shape != sel.shape:
        raise ValueError(f"gate shape {_shape(gate)} must equal sel shape {_shape(sel)}")
    if k > experts:
        raise ValueError(f"sel has k={k} slots per group but weight has only E={experts} experts")
    if check and sel.numel():
        lo, hi = (int(v) for v in torch.aminmax(sel))
        if lo < 0 or hi >= experts:
            raise ValueError(
                f"sel ids must lie in [0, {experts}) (E = {experts}); got values in [{lo}, {hi}]"
            )
    return Layout(n, groups, k, experts, k_in, k_out, x.dim() == 3, reduce)
