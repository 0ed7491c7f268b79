"""Name -> part registries for the composable attention layer and the MLPs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from attnlab.config import ConfigError, PartSpec, closest, from_dict

P = TypeVar("P")


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """Options dataclass for parts that take none."""


@dataclasses.dataclass(frozen=True)
class Entry(Generic[P]):
    name: str
    factory: Callable[..., P]
    options: type
    doc: str
    traits: dict[str, Any]


class Registry(Generic[P]):
    """Parts of one kind (``projections``, ``positions``, ``core``, ``mlp``), looked up by name.

    Each entry has an options dataclass; ``build`` validates a :class:`PartSpec`'s options
    against it and calls the factory with ``options=...`` plus the context keyword arguments.
    """

    def __init__(self, kind: str, traits: dict[str, tuple[Any, str]] | None = None) -> None:
        self.kind = kind
        self.known_traits = dict(traits or {})
        """Each capability a part of this kind may declare: (default, what it means)."""
        self._entries: dict[str, Entry[P]] = {}

    def register(
        self, name: str, options: type = NoOptions, **traits: Any
    ) -> Callable[[Callable[..., P]], Any]:
        """Register a factory under ``name``; ``traits`` declare its capabilities (see
        ``known_traits``), which the configs check, at config time and nowhere else."""
        unknown = sorted(set(traits) - set(self.known_traits))
        if unknown:
            raise ValueError(f"{self.kind} '{name}': unknown trait(s) {unknown}; known: "
                             f"{sorted(self.known_traits)}")

        def decorator(factory: Callable[..., P]) -> Callable[..., P]:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            doc = (factory.__doc__ or "").strip().splitlines()
            self._entries[name] = Entry(name, factory, options, doc[0] if doc else "", traits)
            return factory

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (e.g. to register a new version of your own part)."""
        self.get(name)
        del self._entries[name]

    def names(self, **traits: Any) -> list[str]:
        """Registered names, optionally only those whose traits match."""
        return sorted(
            n for n in self._entries if all(self.trait(n, t) == want for t, want in traits.items())
        )

    def trait(self, name: str, trait: str) -> Any:
        """``name``'s value of ``trait`` (declared, or the trait's default)."""
        return self.get(name).traits.get(trait, self.known_traits[trait][0])

    def get(self, name: str) -> Entry[P]:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} '{name}'{closest(name, self.names())}; "
                f"registered: {self.names()}"
            ) from None

    def options(self, spec: PartSpec) -> Any:
        entry = self.get(spec.name)
        return from_dict(entry.options, spec.options, f"{self.kind}:{spec.name}")

    def build(self, spec: PartSpec, **context: Any) -> P:
        """The part ``spec`` names, with its declared capabilities as ``part.traits`` (every
        known trait's value; a plain dict, so models stay copyable), so code holding a built
        part asks it instead of probing for attributes."""
        part = self.get(spec.name).factory(options=self.options(spec), **context)
        if self.known_traits:
            part.traits = {t: self.trait(spec.name, t) for t in self.known_traits}
        return part


COST = (None, "cost(LayerShape, options) -> (MACs, floats) of one layer's forward "
               "(attnlab.layers.cost); none: attnlab macs does not count it")
PROJECTIONS: Registry[Any] = Registry("projections", {"cost": COST})
POSITIONS: Registry[Any] = Registry("positions", {
    "score_bias": (False, "returns a ScoreBias: needs a core with the score_bias trait"),
    "input_embedding": (False, "a table added at the model input (the model owns it)"),
    "cost": COST,
})
CORES: Registry[Any] = Registry("core", {
    "score_bias": (False, "adds a ScoreBias from the positions to its scores"),
    "memory": (True, "works with Transformer-XL memory (model.memory_len > 0)"),
    "dropout": (False, "applies attention dropout (AttentionConfig.dropout)"),
    "approximate": (False, "depends on q and k beyond q.k (random features, hashing, an "
                           "estimator), so relative positions are not exactly shift-invariant"),
    "tunable_inference": (False, "set_inference(k=, query_skip=) retunes it without training"),
    "learns_attention": (False, "takes teacher attention (teacher_probs) when distilled"),
    "weights_option": (None, "the option naming the distilled weights it needs to be more "
                             "than its initialisation (evaluations refuse it without)"),
    "budget": ((), "the options whose sum is the keys each query row attends to per head "
                   "(none: every key)"),
    "cost": COST,
    "marker": ("x", "the matplotlib marker of its points in the report's figures"),
})
MLPS: Registry[Any] = Registry("mlp", {
    "macs_per_token": (None, "macs_per_token(d_model, d_ff, options) -> forward MACs of one "
                             "token; none: attnlab macs does not count it"),
})


def keys_per_row(spec: PartSpec) -> int | None:
    """Keys each query row of core ``spec`` attends to per head: the sum of the options its
    ``budget`` trait names, defaults included (``window``: sinks + window; ``sea``,
    ``oracle``: k); None for a core that reads every key."""
    names = CORES.trait(spec.name, "budget")
    if not names:
        return None
    options = CORES.options(spec)
    return sum(getattr(options, name) for name in names)


def check_budget(label: str, spec: PartSpec, context: int) -> None:
    """``ConfigError`` when core ``spec`` (called ``label``) keeps every key at ``context``
    tokens: a budget not smaller than the context is dense attention there, so a figure
    measured with it says nothing about the core."""
    budget = keys_per_row(spec)
    if budget is not None and budget >= context:
        raise ConfigError(f"{label} keeps {budget} keys per row, not fewer than the context "
                          f"{context}: it is dense attention there; give a smaller budget or "
                          "drop that length")
