"""Type checks at the public API's door: a wrong type is a ``TypeError`` naming the argument,
what it takes and what it got, instead of an error from deep inside a library."""

from __future__ import annotations

from typing import Any


def require_type(name: str, value: Any, expected: type | tuple[type, ...], wanted: str
                 ) -> None:
    """``TypeError`` unless ``value`` (argument ``name``) is an ``expected`` instance
    (``wanted`` says so in words, e.g. ``"a transformers model (PreTrainedModel)"``); a
    ``bool`` passes only where ``bool`` is expected, not as an ``int``."""
    types = expected if isinstance(expected, tuple) else (expected,)
    if not isinstance(value, types) or isinstance(value, bool) and bool not in types:
        raise TypeError(f"{name} must be {wanted}, got {given(value)}")


def given(value: Any) -> str:
    """``value`` for an error message: its type, and the value itself when it is short."""
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"
    text = repr(value)
    return f"{name} {text}" if len(text) <= 60 and "\n" not in text else name
