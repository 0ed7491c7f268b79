"""Dataclass configs loaded from YAML, with strict validation.

Every config section is a dataclass. ``from_dict`` builds one from a plain mapping and
rejects unknown keys (naming the closest valid key) and values of the wrong type, so a
typo in a YAML file or a ``--set`` override fails loudly instead of being ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml

from attnlab.utils.readers import read_text

T = TypeVar("T")


def builtin_config(name: str) -> Path:
    """Path of a config shipped with the package (``tiny`` -> ``attnlab/configs/tiny.yaml``)."""
    return Path(str(resources.files("attnlab") / "configs" / f"{name}.yaml"))


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the fix."""


@dataclasses.dataclass(frozen=True)
class PartSpec:
    """A registry entry chosen by name, with its own options.

    Written in YAML either as a bare name (``core: sdpa``) or as a mapping with a ``name``
    key and the part's options (``core: {name: sea, k: 64}``). The options are validated
    against the part's own options dataclass by the registry that builds it.
    """

    name: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def parse(cls, value: Any, where: str) -> PartSpec:
        if isinstance(value, PartSpec):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            if "name" not in value:
                raise ConfigError(
                    f"{where}: a mapping needs a 'name' key, got keys {sorted(value)}"
                )
            options = {k: v for k, v in value.items() if k != "name"}
            return cls(str(value["name"]), options)
        raise ConfigError(f"{where}: expected a name or a mapping with 'name', got {value!r}")

    def to_yaml(self) -> str | dict[str, Any]:
        return {"name": self.name, **self.options} if self.options else self.name


def closest(key: str, choices: Sequence[str]) -> str:
    """A ' (did you mean X?)' hint for ``key`` among ``choices``, or ''."""
    match = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _coerce(value: Any, tp: Any, where: str) -> Any:
    tp, optional = _unwrap_optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise ConfigError(f"{where}: may not be null")
    if tp is Any:
        return value
    if tp is PartSpec:
        return PartSpec.parse(value, where)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, where)
    origin = typing.get_origin(tp)
    if origin in (list, tuple, Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if typing.get_origin(tp) is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {list(choices)}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML reads 1e-3 (no dot) as a string
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(number):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def from_dict(cls: type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            valid = f"valid keys here: {sorted(fields)}" if fields else "it takes no options"
            raise ConfigError(
                f"unknown config key '{path}'{closest(str(key), list(fields))}; {valid}"
            )
        kwargs[key] = _coerce(value, hints[key], path)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ConfigError:
            raise
        except ValueError as err:
            raise ConfigError(f"{where or cls.__name__}: {err}") from err
    return obj


def to_dict(obj: Any) -> Any:
    """Plain YAML-friendly structure of a (nested) config dataclass."""
    if isinstance(obj, PartSpec):
        return obj.to_yaml()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``a.b.c=value`` override (value parsed as YAML) to nested dict ``data``."""
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like key.path=value")
    path, raw = assignment.split("=", 1)
    keys = path.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override {assignment!r}: {path!r} is not a key path like train.lr")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"override {assignment!r}: the value is not valid YAML "
                          f"({yaml_problem(err)}); "
                          "quote a mapping, e.g. --set 'key={name: sea, k: 16}'") from err
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if isinstance(child, str):  # a bare PartSpec name being given options
            child = {"name": child}
        node[key] = child if isinstance(child, dict) else {}
        node = node[key]
    node[keys[-1]] = value


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and, when known, where it is."""
    problem = " ".join(str(getattr(err, "problem", None) or err).split())
    mark = getattr(err, "problem_mark", None)
    return problem if mark is None else \
        f"{problem} at line {mark.line + 1}, column {mark.column + 1}"


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from ``path`` with a clear error for missing or invalid files."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(read_text(path, "a YAML file"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({yaml_problem(err)})") from err
    if data is None:  # read as the defaults, it would stand for a config it is not
        raise ConfigError(f"{path}: the file holds no settings (empty, or only comments); "
                          "a config is a mapping of sections")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def dump_yaml(obj: Any) -> str:
    return yaml.safe_dump(to_dict(obj), sort_keys=False)
