"""Files of distilled page estimators: one safetensors file of every layer's estimator.

The file holds ``layers.{i}.{query,key,distance}`` (:class:`~attnlab.layers.page_estimator.
PageEstimator`) and, as safetensors metadata, what they fit: the model (``model``,
``d_model``, ``n_layers``, ``n_heads``, ``d_head``), the estimator (``page``, ``width``,
``n_buckets``) and how they were made (``recipe``, JSON). A shipped set is named without a
path (:data:`SHIPPED`); anything else is a path.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from attnlab.config import ConfigError

FORMAT = "attnlab-page-estimators"
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "estimators"
SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "d_head")
ESTIMATOR_KEYS = ("page", "width", "n_buckets")


def shipped() -> list[str]:
    """Names of the estimator sets shipped with attnlab (e.g. ``smollm2-135m``)."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.safetensors"))


def resolve(name_or_path: str) -> Path:
    """The file of a shipped set's name, or the path given; ``ConfigError`` if neither."""
    if "/" not in name_or_path and not name_or_path.endswith(".safetensors"):
        path = SHIPPED_DIR / f"{name_or_path}.safetensors"
        if path.is_file():
            return path
        raise ConfigError(f"estimators {name_or_path!r}: no shipped set of that name (shipped: "
                          f"{shipped()}); give a name or the path of an estimators file "
                          "(attnlab distill-estimators' OUT/estimators.safetensors)")
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(f"estimators {name_or_path!r}: no such file; give a shipped set "
                          f"({shipped()}) or attnlab distill-estimators' "
                          "OUT/estimators.safetensors")
    return path


def save_estimators(path: str | Path, layers: Mapping[int, Mapping[str, Tensor]],
                    meta: Mapping[str, Any]) -> None:
    """Write ``layers`` ({layer: {name: tensor}}) stored in float16, with ``meta``."""
    tensors = {f"layers.{i}.{name}": t.detach().to(torch.float16).contiguous()
               for i, params in layers.items() for name, t in params.items()}
    text = {key: json.dumps(value) for key, value in {"format": FORMAT, **meta}.items()}
    save_file(tensors, str(path), metadata=text)


@functools.lru_cache(maxsize=4)
def _read(path: str, mtime_ns: int) -> tuple[dict[str, Any], dict[str, Tensor]]:
    try:
        with safe_open(path, framework="pt") as f:
            meta = {key: json.loads(value) for key, value in (f.metadata() or {}).items()}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise ConfigError(f"estimators {path}: not a readable safetensors file ({err})") from err
    if meta.get("format") != FORMAT:
        raise ConfigError(f"estimators {path}: not an attnlab estimators file (its metadata "
                          f"has format {meta.get('format')!r}, expected {FORMAT!r})")
    return meta, tensors


def read_estimators(name_or_path: str) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(metadata, tensors) of a shipped set or a file (read once per file version)."""
    path = resolve(name_or_path)
    return _read(str(path), path.stat().st_mtime_ns)


def layer_estimator(name_or_path: str, layer: int, facts: Mapping[str, int]
                    ) -> dict[str, Tensor]:
    """Layer ``layer``'s tensors of a set, after checking that the set was made for a model
    and estimator with these ``facts`` (:data:`SHAPE_KEYS` and :data:`ESTIMATOR_KEYS`);
    ``ConfigError`` naming each mismatch."""
    meta, tensors = read_estimators(name_or_path)
    wrong = [f"{key} {meta.get(key)} (this model/core: {facts[key]})"
             for key in (*SHAPE_KEYS, *ESTIMATOR_KEYS) if meta.get(key) != facts[key]]
    if wrong:
        raise ConfigError(f"estimators {name_or_path!r} were distilled for "
                          f"{meta.get('model', 'another model')} and do not fit: "
                          + ", ".join(wrong))
    prefix = f"layers.{layer}."
    found = {name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}
    if not found:
        raise ConfigError(f"estimators {name_or_path!r} have no layer {layer}")
    return found
