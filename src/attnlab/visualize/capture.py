"""Forward hooks that keep what chosen modules were called with, for one forward."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from torch import nn


@dataclasses.dataclass
class Call:
    """A module's positional and keyword arguments of one call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@contextlib.contextmanager
def captured_calls(modules: Sequence[nn.Module]) -> Iterator[list[Call | None]]:
    """``calls[i]``: the last call of ``modules[i]`` inside the block (None: not called)."""
    calls: list[Call | None] = [None] * len(modules)
    handles = []
    for i, module in enumerate(modules):

        def keep(module, args, kwargs, i=i) -> None:
            calls[i] = Call(args, kwargs)

        handles.append(module.register_forward_pre_hook(keep, with_kwargs=True))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()
