"""Useful multiply-accumulate count of one expert matmul (for the MAC accounting)."""

from __future__ import annotations

from attnlab.ops.expert_matmul.layout import REDUCTIONS


def expert_matmul_macs(
    n: int, groups: int, k: int, k_in: int, k_out: int, reduce: str, *, gated: bool = True
) -> int:
    """Forward MACs the op must do, whatever the backend.

    ``N*G*k*K_in*K_out`` for the products, plus ``N*G*k*K_out`` for the gate-weighted sum when
    ``gated`` and ``reduce`` is "slots" or "all" (one multiply-add per slot and output
    element). reduce="none" has no reduction, and an ungated sum only adds, so neither adds a
    term. Extra work of a backend (the dense all-experts path) is not credited.
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    slots = n * groups * k
    reduction = slots * k_out if gated and reduce != "none" else 0
    return slots * k_in * k_out + reduction
