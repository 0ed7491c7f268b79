"""Every fast op against its naive reference (:mod:`attnlab.ops.contract`): each registered
contract on each of its cases, in float64 and the lower precisions it supports."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

from attnlab.ops.contract import Example, OpContract, contracts, op_modules
from attnlab.utils.testing import assert_close

F64 = torch.float64
ZERO = 1e-12
"""The RMS below which a float64 reference is zero in exact arithmetic (rounding noise of
the examples' order-1 values), e.g. the queries' gradient when each query sees one key."""
NOT_REGISTERED = {
    "attnlab.ops.sea.mask.dense_mask_reference":
        "a dense mask over ranks, the reference of decompress's padded rank lists: the two "
        "agree only after a conversion, and on no float input (test_sea_ops compares them)",
}
"""References (functions named ``*_naive`` or ``*_reference``) with no contract, and why."""


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: the examples are tiny, and a second thread costs each op a wait
    at its barrier (milliseconds when the other core is busy). The native kernels' threading
    is tested by their own tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rms(x: torch.Tensor) -> float:
    """Root mean square of ``x``, in float64."""
    return x.detach().double().square().mean().sqrt().item()


def _assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, tolerance: float) -> None:
    """:func:`assert_close` (relative RMS error at most ``tolerance``), empty tensors
    included; against a reference that is zero (:data:`ZERO`), the RMS of ``out``."""
    assert out.shape == ref.shape, (name, tuple(out.shape), tuple(ref.shape))
    if ref.numel() and _rms(ref) > ZERO:
        assert_close(name, ref, out, tolerance)
    elif ref.numel():  # relative errors would be noise over noise
        assert _rms(out) <= tolerance, (name, _rms(out))


def _params() -> list:
    """(contract, case, dtype) for every registered contract, case and checked dtype."""
    return [pytest.param(contract, case, dtype, id=f"{contract.name}-{case.name}-{str(dtype)[6:]}")
            for contract in contracts() for case in contract.cases
            for dtype in contract.tolerances()]


def _call(fn: Callable[..., torch.Tensor], example: Example, **options: Any) -> torch.Tensor:
    """``fn`` on the example's inputs, 0 where the contract leaves the output undefined."""
    out = fn(**example.inputs, **options)
    return out if example.defined is None else out.masked_fill(~example.defined, 0.0)


def _leaves(contract: OpContract, example: Example) -> dict[str, torch.Tensor]:
    """The example's differentiable inputs (those present) by name, now requiring gradients."""
    return {name: example.inputs[name].requires_grad_() for name in contract.grads
            if example.inputs.get(name) is not None}


@pytest.mark.parametrize(("contract", "case", "dtype"), _params())
def test_fast_op_equals_its_naive_reference(monkeypatch, contract, case, dtype):
    """Output shape and dtype as documented; the forward without autograd (the inference
    path: native kernels where they serve) and with it, and the gradient of every
    differentiable input for one random cotangent, against the float64 reference on the same
    values."""
    for target, value in case.patches:
        monkeypatch.setattr(target, value)
    example = contract.example(case, dtype=dtype)
    reference = example.to(F64)
    tolerance = contract.tolerances()[dtype]
    ref_leaves = _leaves(contract, reference)
    ref = _call(contract.naive, reference)
    with torch.no_grad():
        out = _call(contract.fast, example, **example.options)
    assert tuple(out.shape) == example.shape, (tuple(out.shape), example.shape)
    assert out.dtype == dtype
    _assert_close("forward", ref, out, tolerance)
    leaves = _leaves(contract, example)
    out = _call(contract.fast, example, **example.options)
    _assert_close("forward with autograd", ref, out, tolerance)
    if not leaves:
        return
    cotangent = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    grads = torch.autograd.grad(out, list(leaves.values()), cotangent.to(dtype))
    ref_grads = torch.autograd.grad(ref, list(ref_leaves.values()), cotangent)
    for name, grad, ref_grad in zip(leaves, grads, ref_grads, strict=True):
        assert grad.dtype == dtype
        _assert_close(f"grad {name}", ref_grad, grad, tolerance)


def test_every_naive_reference_has_a_contract():
    """A function named ``*_naive`` or ``*_reference`` in an op module is some registered
    contract's reference (or listed, with the reason, in :data:`NOT_REGISTERED`), so an op
    added with its reference fails here until it registers its contract."""
    registered = {contract.naive for contract in contracts()}
    found = sorted(
        f"{module.__name__}.{name}" for module in op_modules()
        for name, fn in vars(module).items()
        if name.endswith(("_naive", "_reference")) and inspect.isfunction(fn)
        and fn.__module__ == module.__name__ and fn not in registered)
    assert found == sorted(NOT_REGISTERED)


def test_contracts_are_well_formed():
    """Each contract has cases of distinct names, and each of its differentiable inputs is a
    parameter of the op and of the reference (a misspelt one would get no gradient)."""
    for contract in contracts():
        cases = [case.name for case in contract.cases]
        assert cases and len(cases) == len(set(cases)), contract.name
        for fn in (contract.fast, contract.naive):
            missing = set(contract.grads) - set(inspect.signature(fn).parameters)
            assert not missing, (contract.name, fn.__name__, missing)
