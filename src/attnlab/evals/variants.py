"""The models a long-context evaluation compares: a Hugging Face model and variants of it.

A variant is given as YAML (from the CLI or a config):

* ``original``: the model as loaded;
* ``{name: CORE, ...options}``: the model converted to an attnlab core, training-free
  (``window``, ``oracle``, ``sdpa``, ``performer``, ...). A core that learns its attention
  from a teacher (``learns_attention``: ``sea``) is refused here: converted without
  distillation its estimator is random, and its scores would pass for the core's;
* ``{name: sea_pages, budget: 256, estimators: smollm2-135m}``: a core with distilled
  weights of its own (``weights_option``), loaded from a shipped set or a file; refused
  without them;
* ``{name: sea, student: FOLDER, k: 256}``: a distilled student folder (``attnlab distill``'s
  ``OUT/student``) of the same model, named by the core it was distilled to (its config
  records it); a core that retunes its budget at inference (``tunable_inference``: SEA's
  ``k``) takes its budget options (default: as saved). Its SEA position tables were trained
  on the first ``trained_len`` ranks (recorded by ``attnlab distill``; give ``trained_len``
  for older folders) and are stretched by nearest neighbour past that
  (:class:`attnlab.evals.models.Models`).

Any variant may set ``label`` (default: derived from the spec, e.g. ``window 256``, or
``oracle p16 256`` where the spec sets a ``page`` size other than the core's default).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from attnlab.config import ConfigError, PartSpec
from attnlab.layers import CORES
from attnlab.layers.estimator_file import shipped
from attnlab.layers.registry import keys_per_row

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
    def spec(self) -> PartSpec | None:
        """The core and its options (None: the original)."""
        return None if self.core is None else PartSpec(self.core, dict(self.options))

    @property
    def keys_per_row(self) -> int | None:
        """Keys each query row attends to per head (None: every key), its core's defaults
        included (:func:`attnlab.layers.registry.keys_per_row`)."""
        return None if self.spec is None else keys_per_row(self.spec)

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
    if trained_len is not None and (isinstance(trained_len, bool)
                                    or not isinstance(trained_len, int) or trained_len < 1):
        raise ConfigError(f"variant {spec!r}: trained_len must be a positive integer (the "
                          f"tokens the student was distilled at), got {trained_len!r}")
    if student is None:
        if trained_len is not None:
            raise ConfigError(f"variant {spec!r}: trained_len applies to a student folder")
        CORES.options(PartSpec(name, options))  # validates, with close-key hints
        weights = CORES.trait(name, "weights_option")
        if weights and not options.get(weights):
            raise ConfigError(
                f"variant {spec!r}: the {name} core runs on distilled {weights}, and without "
                f"them it would run untrained and its figures would pass for {name}'s; give "
                f"'{weights}: NAME_OR_FILE' (shipped: {shipped()}; or attnlab "
                "distill-estimators' OUT/estimators.safetensors)")
        if CORES.trait(name, "learns_attention"):
            raise ConfigError(
                f"variant {spec!r}: the {name} core learns its attention from the model (it is "
                "distilled), and converted here it would run untrained: its figures would be "
                f"an untrained {name}'s, not {name}'s; distil a student first (attnlab distill "
                f"--teacher MODEL --student-attention {name} --out OUT) and give '{{name: "
                f"{name}, student: OUT/student}}'")
    elif name not in CORES.names() or set(options) - set(_retunable(name)):
        raise ConfigError(f"variant {spec!r}: a student folder takes the name of the core it "
                          f"was distilled to and at most the options it retunes at inference "
                          f"({list(_retunable(name)) if name in CORES.names() else 'none'}; "
                          "its other options are saved with it)")
    else:  # its budget as saved unless given (None: the core's default, as it ran)
        saved = _saved_options(spec, name, Path(student))
        options = {**{k: saved[k] for k in _retunable(name) if k in saved}, **options}
    variant = Variant(label or "", name, options, student, trained_len)
    return dataclasses.replace(variant, label=label or _label(variant))


def _label(variant: Variant) -> str:
    budget = variant.keys_per_row
    name = f"{variant.core} student" if variant.student else str(variant.core)
    page = variant.options.get("page")
    if page is not None and variant.core is not None:
        default = getattr(CORES.options(PartSpec(variant.core, {})), "page", None)
        if page != default:
            name += f" p{page}"
    return f"{name} {budget}" if budget else name


def _retunable(core: str) -> tuple[str, ...]:
    """The options of a distilled ``core`` that a variant may change: its budget, when the
    core retunes it at inference (``tunable_inference``; SEA's k)."""
    return CORES.trait(core, "budget") if CORES.trait(core, "tunable_inference") else ()


def _saved_options(spec: Any, core: str, student: Path) -> dict[str, Any]:
    """The options of ``core`` a student folder's ``config.json`` records
    (``attnlab.hf.convert``'s entry); ``ConfigError`` when it is no student of that core."""
    from attnlab.hf.convert import CONFIG_KEY  # imports transformers: only for a student

    config = student / "config.json"
    if not config.is_file():
        raise ConfigError(f"variant {spec!r}: {student} is not a student folder (no "
                          "config.json); give attnlab distill's OUT/student")
    try:
        entry = json.loads(config.read_text()).get(CONFIG_KEY) or {}
    except (OSError, ValueError) as err:
        raise ConfigError(f"variant {spec!r}: {config} cannot be read ({err}); give attnlab "
                          "distill's OUT/student") from err
    if entry.get("core") != core:
        raise ConfigError(f"variant {spec!r}: {student} is not a {core} student (its config "
                          f"records core {entry.get('core')!r}); give attnlab distill's "
                          f"OUT/student of a {core} distillation")
    return dict(entry.get("options") or {})
