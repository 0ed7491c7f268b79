"""The contract of the ops that have a naive reference, and the registry of those ops.

A fast op and its naive reference take the same inputs and give the same output: equal in
float64 (forward, and the gradients of every differentiable input), close in the lower
precisions the op supports. Each such op registers an :class:`OpContract` next to its code
(:func:`register`): how to draw example inputs for named :class:`Case`\\ s (its edge cases
included), which inputs are differentiable, and its low-precision tolerances.
``tests/ops/test_contract.py`` checks every registered contract on every case, so a new op is
covered by registering it.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch import Tensor

FLOAT64_TOLERANCE = 1e-13
"""Relative RMS error allowed between a fast op and its reference in float64, forward and
gradients (what is left is the order of the sums: about 1e-15)."""
FLOAT32: Mapping[torch.dtype, float] = MappingProxyType({torch.float32: 1e-5})
"""Low-precision tolerances of an op computing in its inputs' dtype (float32: about 1e-6)."""
FLOAT32_BFLOAT16: Mapping[torch.dtype, float] = MappingProxyType(
    {**FLOAT32, torch.bfloat16: 2 * torch.finfo(torch.bfloat16).eps})
"""Those of an op computing in at least float32, so bfloat16 outputs and gradients are
rounded once (a score bias computed in bfloat16 adds about as much again)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """A named example of an op: ``params`` go to its contract's ``make``; ``patches`` set
    module attributes (dotted path, value) while the case runs, e.g. a small block size so a
    short example spans several blocks."""

    name: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    patches: tuple[tuple[str, Any], ...] = ()


def grid(*, label: str = "", patches: tuple[tuple[str, Any], ...] = (),
         **choices: Iterable[Any]) -> tuple[Case, ...]:
    """A case for every combination of ``choices`` (parameter -> its values), each with
    ``patches``, named by ``label`` and the combination (``label-causal=True-padded=False``)."""
    names = list(choices)
    cases = []
    for values in itertools.product(*choices.values()):
        params = dict(zip(names, values, strict=True))
        words = [label] if label else []
        cases.append(Case("-".join(words + [f"{n}={v}" for n, v in params.items()]), params,
                          patches))
    return tuple(cases)


def _convert(value: Any, dtype: torch.dtype, device: torch.device | str) -> Any:
    """``value`` with its floating tensors (also the fields of a dataclass) in ``dtype``, every
    tensor detached and on ``device``; anything else as it is."""
    if isinstance(value, Tensor):
        return value.detach().to(device, dtype if value.is_floating_point() else None)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _convert(getattr(value, f.name), dtype,
                                                              device)
                                             for f in dataclasses.fields(value) if f.init})
    return value


@dataclasses.dataclass(frozen=True)
class Example:
    """One call: ``inputs`` (keyword arguments) go to the fast op and to its reference,
    ``options`` to the fast op only (a backend, a chunk size). ``shape`` is the documented
    output shape; ``defined`` (bool, broadcastable to the output; None: all) marks the
    outputs the contract defines (not, say, those of padded queries)."""

    inputs: Mapping[str, Any]
    shape: tuple[int, ...]
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    defined: Tensor | None = None

    def to(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> Example:
        """A copy with floating tensors in ``dtype``, every tensor detached, on ``device``."""
        return dataclasses.replace(
            self, inputs={name: _convert(x, dtype, device) for name, x in self.inputs.items()},
            defined=_convert(self.defined, dtype, device))


@dataclasses.dataclass(frozen=True)
class OpContract:
    """A fast op, its naive reference, and how to test one against the other.

    ``make(generator, **case.params)`` draws an :class:`Example` in float64 on the CPU;
    ``grads`` names the inputs that are differentiable (those present and not None get
    gradients); ``low_precision`` maps each lower dtype the op supports to the relative RMS
    error allowed against the float64 reference on the same (rounded) values.
    """

    name: str
    fast: Callable[..., Tensor]
    naive: Callable[..., Tensor]
    make: Callable[..., Example]
    cases: tuple[Case, ...]
    grads: tuple[str, ...] = ("q", "k", "v")
    low_precision: Mapping[torch.dtype, float] = dataclasses.field(default_factory=dict)

    def tolerances(self) -> dict[torch.dtype, float]:
        """Each dtype the contract is checked in, with its tolerance (float64 first)."""
        return {torch.float64: FLOAT64_TOLERANCE, **self.low_precision}

    def example(self, case: Case, *, dtype: torch.dtype = torch.float64,
                device: torch.device | str = "cpu", seed: int = 0) -> Example:
        """The inputs of ``case`` drawn from ``seed``, in ``dtype`` on ``device``."""
        return self.make(torch.Generator().manual_seed(seed), **case.params).to(dtype, device)


_CONTRACTS: dict[str, OpContract] = {}


def register(contract: OpContract) -> OpContract:
    """Add ``contract`` to the registry (next to the op, at import); a name registers once."""
    if contract.name in _CONTRACTS:
        raise ValueError(f"an op contract named '{contract.name}' is already registered")
    _CONTRACTS[contract.name] = contract
    return contract


def op_modules() -> Iterator[ModuleType]:
    """Every module of :mod:`attnlab.ops`, imported (which registers its contracts); one that
    needs a missing optional package (``triton``) is left out."""
    import attnlab.ops

    for info in pkgutil.walk_packages(attnlab.ops.__path__, "attnlab.ops."):
        try:
            yield importlib.import_module(info.name)
        except ModuleNotFoundError as err:
            if err.name is None or err.name.partition(".")[0] == "attnlab":
                raise


def contracts() -> list[OpContract]:
    """Every registered contract, by name, once every op module is imported."""
    for _ in op_modules():
        pass
    return [_CONTRACTS[name] for name in sorted(_CONTRACTS)]


def normal(gen: torch.Generator, *shape: int) -> Tensor:
    """Standard normal float64 ``shape`` from ``gen``."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def attention_inputs(gen: torch.Generator, *, b: int = 2, h: int = 4, hk: int = 2,
                     t_q: int, t_k: int, d: int = 8, dv: int = 6) -> dict[str, Tensor]:
    """Normal ``q [b, h, t_q, d]``, ``k [b, hk, t_k, d]``, ``v [b, hk, t_k, dv]``."""
    return {"q": normal(gen, b, h, t_q, d), "k": normal(gen, b, hk, t_k, d),
            "v": normal(gen, b, hk, t_k, dv)}


def attention_shape(inputs: Mapping[str, Tensor]) -> tuple[int, int, int, int]:
    """``[B, H, Tq, Dv]``, the output shape of attention of ``inputs``' q over its k, v."""
    return (*inputs["q"].shape[:3], inputs["v"].shape[-1])


def padding_mask(b: int, t: int) -> Tensor:
    """``[b, t]`` bool key padding (True = real key), ``b >= 2``: a hole in row 0 (from
    ``t // 4``, ``max(1, t // 9)`` keys) and ``t // 6`` keys of left padding in row 1."""
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, t // 4:t // 4 + max(1, t // 9)] = False
    mask[1, :t // 6] = False
    return mask
