"""The models a long-context evaluation compares: a Hugging Face model and variants of it.

A variant is given as YAML (from the CLI or a config):

* ``original``: the model as loaded;
* ``{name: CORE, ...options}``: the model converted to an attnlab core, training-free
  (``window``, ``oracle``, ``sdpa``, ``performer``, ...);
* ``{name: sea, student: FOLDER, k: 256}``: a distilled student folder (``attnlab distill``'s
  ``OUT/student``) of the same model, at SEA key budget ``k`` (dynamic k; default: as saved).
  Its SEA position tables were trained on the first ``trained_len`` ranks (recorded by
  ``attnlab distill``; give ``trained_len`` for older folders) and are stretched by nearest
  neighbour past that (:class:`attnlab.evals.models.Models`).

Any variant may set ``label`` (default: derived from the spec, e.g. ``window 256``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from attnlab.config import ConfigError, PartSpec
from attnlab.layers import CORES

ORIGINAL = "original"


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compared model: ``core`` None = the original."""

    label: str
    core: str | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    student: str | None = None
    trained_len: int | None = None

    @property
    def keys_per_row(self) -> int | None:
        """Keys each query row attends to per head (None: every key)."""
        if self.core == "window":
            sinks, window = (self.options.get(n, d) for n, d in (("sinks", 4), ("window", 1024)))
            return sinks + window
        if self.core in ("oracle", "sea"):
            return self.options.get("k")
        return None

    def to_json(self) -> dict[str, Any]:
        out = {"label": self.label, "core": self.core or ORIGINAL, "options": dict(self.options),
               "keys_per_row": self.keys_per_row}
        if self.student:
            out.update(student=self.student, trained_len=self.trained_len)
        return out


def parse_variant(spec: Any) -> Variant:
    """A :class:`Variant` from a YAML string or a mapping (module docstring); ``ConfigError``
    naming the problem."""
    if isinstance(spec, str):
        try:
            spec = yaml.safe_load(spec)
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or err  # one line, not the marked excerpt
            raise ConfigError(f"variant {spec!r} is not valid YAML: {problem}") from err
    if spec == ORIGINAL:
        return Variant(ORIGINAL)
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ConfigError(f"variant {spec!r}: give 'original', a core name or a mapping with "
                          f"'name' (one of {CORES.names()})")
    options = dict(spec)
    name = options.pop("name")
    label = options.pop("label", None)
    student = options.pop("student", None)
    trained_len = options.pop("trained_len", None)
    if student is None:
        if trained_len is not None:
            raise ConfigError(f"variant {spec!r}: trained_len applies to a student folder")
        CORES.options(PartSpec(name, options))  # validates, with close-key hints
    elif name != "sea" or set(options) - {"k"}:
        raise ConfigError(f"variant {spec!r}: a student folder takes name 'sea' and at most "
                          "option k (its other options are saved with it)")
    elif not (Path(student) / "config.json").is_file():
        raise ConfigError(f"variant {spec!r}: {student} is not a student folder (no "
                          "config.json); give attnlab distill's OUT/student")
    variant = Variant(label or "", name, options, student, trained_len)
    return dataclasses.replace(variant, label=label or _label(variant))


def _label(variant: Variant) -> str:
    budget = variant.keys_per_row
    name = "sea student" if variant.student else variant.core
    return f"{name} {budget}" if budget else str(name)


def check_budget(variant: Variant, context: int) -> None:
    """``ConfigError`` when ``variant`` keeps every key at ``context`` (its budget is not
    smaller than the context, so it is dense attention there and compares nothing)."""
    budget = variant.keys_per_row
    if budget is not None and budget >= context:
        raise ConfigError(f"variant {variant.label!r} keeps {budget} keys per row, not fewer "
                          f"than the context {context}: it is dense attention there; give a "
                          "smaller budget or drop that length")
