"""Numerical comparison helpers shared by the test-suite and the benchmarks' self-checks."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)


def rel_rms_error(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Root-mean-square of ``out - ref`` divided by the RMS of ``ref`` (0 when both are 0)."""
    ref64, out64 = ref.detach().double(), out.detach().double()
    denom = ref64.pow(2).mean().sqrt().item()
    err = (out64 - ref64).pow(2).mean().sqrt().item()
    return err / denom if denom > 0 else err


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float) -> None:
    """Assert ``out`` matches ``ref`` to a relative RMS error below ``ratio``.

    Also fails on NaN/inf in ``out`` and on shape mismatch; logs the max-abs error so a
    failing comparison says by how much it failed.
    """
    if ref.shape != out.shape:
        raise AssertionError(f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    if not torch.isfinite(out).all():
        raise AssertionError(f"{name}: output has NaN or inf")
    max_abs = (out.detach().double() - ref.detach().double()).abs().max().item()
    err = rel_rms_error(ref, out)
    logger.info("%s: max-abs %.3g, rel-rms %.3g (limit %.3g)", name, max_abs, err, ratio)
    if err > ratio:
        raise AssertionError(
            f"{name}: rel-rms error {err:.3g} > {ratio:.3g} (max-abs {max_abs:.3g})"
        )


def assert_grads_close(ref: torch.Tensor, out: torch.Tensor, leaves: Sequence[torch.Tensor],
                       names: str, ratio: float) -> None:
    """Backpropagate one random cotangent through ``ref`` and ``out`` and assert the
    gradients of every leaf agree (:func:`assert_close`); ``names`` labels the leaves, one
    character each."""
    grad = torch.randn_like(out)
    for name, g, g_ref in zip(names, torch.autograd.grad(out, leaves, grad, retain_graph=True),
                              torch.autograd.grad(ref, leaves, grad, retain_graph=True),
                              strict=True):
        assert_close(f"grad {name}", g_ref, g, ratio)
