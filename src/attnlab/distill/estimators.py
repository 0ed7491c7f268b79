"""``attnlab distill-estimators``: the page estimators of a Hugging Face model, distilled
frozen and per layer (:mod:`attnlab.distill.frozen`), written as one estimators file.

The output folder holds ``estimators.safetensors`` (what ``{name: sea_pages, estimators:
FILE}`` loads), ``curves.json`` (each layer's training KL per step and held-out measures),
``loss.png`` and ``recipe.yaml``. Everything is checked before the model is loaded.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm.auto import tqdm

import attnlab.hf
from attnlab.config import ConfigError, apply_override, builtin_config, from_dict, load_yaml
from attnlab.data import DataConfig
from attnlab.data.load import open_source
from attnlab.distill.frozen import (
    FrozenRecipe,
    QueryKeyRecorder,
    layer_samples,
    sample_rows,
    train_layer,
)
from attnlab.layers.estimator_file import save_estimators
from attnlab.layers.page_estimator import PageEstimator
from attnlab.utils.outputs import OutputFolder
from attnlab.utils.provenance import available_cores

logger = logging.getLogger(__name__)


def load_recipe(source: str | Path | None, overrides: Sequence[str] = ()) -> FrozenRecipe:
    """A :class:`FrozenRecipe` from a YAML file with an ``estimators:`` section (a path, or a
    built-in name such as ``smollm2/estimators``), then ``key=value`` overrides, validated."""
    data: dict[str, Any] = {}
    if source is not None:
        path = Path(source)
        if not path.is_file() and builtin_config(str(source)).is_file():
            path = builtin_config(str(source))
        data = load_yaml(path)
    for assignment in overrides:
        key = assignment if assignment.startswith("estimators.") else f"estimators.{assignment}"
        apply_override(data, key)
    unknown = sorted(set(data) - {"estimators"})
    if unknown:
        raise ConfigError(f"an estimator recipe has one section, estimators:, got {unknown}")
    recipe = from_dict(FrozenRecipe, data.get("estimators") or {}, "estimators")
    recipe.validate()
    return recipe


def training_sequences(tokenizer: Any, recipe: FrozenRecipe) -> list[torch.Tensor]:
    """``sequences + 1`` windows of ``seq_len`` tokens, each from another document of the
    recipe's corpus split (the last is held out), starting at a seeded offset."""
    source = open_source(DataConfig(corpus=recipe.corpus))
    generator = torch.Generator().manual_seed(recipe.seed)
    out = []
    for _, text in source.read_documents(recipe.split):
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) < recipe.seq_len:
            continue
        start = int(torch.randint(len(ids) - recipe.seq_len + 1, (1,), generator=generator))
        out.append(torch.tensor(ids[start:start + recipe.seq_len]))
        if len(out) == recipe.sequences + 1:
            return out
    raise ConfigError(f"corpus {recipe.corpus!r} ({recipe.split}) has {len(out)} documents of "
                      f"at least {recipe.seq_len} tokens; the recipe needs {recipe.sequences} "
                      "+ 1 held out: lower sequences or seq_len")


def check_model_fits(config: Any, recipe: FrozenRecipe) -> None:
    """``ConfigError`` for a model the recipe cannot serve: a ``seq_len`` beyond its
    positions, ``layers`` it does not have."""
    positions = int(getattr(config, "max_position_embeddings", recipe.seq_len))
    if recipe.seq_len > positions:
        raise ConfigError(f"seq_len {recipe.seq_len} is beyond the model's {positions} positions")
    n_layers = config.num_hidden_layers
    missing = sorted(i for i in recipe.layers or () if i >= n_layers)
    if missing:
        raise ConfigError(f"the recipe names layer(s) {missing}, but the model has {n_layers} "
                          f"layers (0-{n_layers - 1})")


def record_teacher(model: Any, sequences: list[torch.Tensor], positions: list[torch.Tensor],
                   progress: bool) -> list[dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """Each sequence's recorded keys and sampled queries per layer, from dense forwards of
    a copy of ``model`` converted to the exact ``sdpa`` core (``model`` is not touched)."""
    teacher = attnlab.hf.convert(copy.deepcopy(model).eval(), "sdpa")
    recorder = QueryKeyRecorder(attnlab.hf.cores(teacher))
    recorded = []
    with torch.no_grad(), tqdm(sequences, desc="teacher forwards", disable=not progress) as bar:
        for ids, rows in zip(bar, positions, strict=True):
            recorded.append(recorder.record(lambda ids=ids: teacher(ids[None]), rows))
    recorder.close()
    return recorded


def distill_estimators(model_folder: str | Path, recipe: FrozenRecipe, out_dir: str | Path, *,
                       gguf_file: str | None = None, force: bool = False,
                       progress: bool = True) -> dict[str, Any]:
    """Distil, save and return the summary (module docstring)."""
    out = OutputFolder.of(out_dir, "distill-estimators", force=force, inputs=[model_folder])
    out.check()
    model, fingerprint = attnlab.hf.load_fingerprinted(model_folder, gguf_file)
    check_model_fits(model.config, recipe)
    tokenizer = attnlab.hf.load_tokenizer(model_folder, gguf_file=gguf_file)
    sequences = training_sequences(tokenizer, recipe)
    started = time.perf_counter()
    frozen = {name: p.detach().clone() for name, p in model.state_dict().items()}
    generator = torch.Generator().manual_seed(recipe.seed)
    positions = [sample_rows(recipe, generator) for _ in sequences]
    recorded = record_teacher(model, sequences, positions, progress)
    config = model.config
    n_heads = config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or n_heads
    scale = d_head ** -0.5
    weights, curves = {}, []
    n_layers = config.num_hidden_layers
    chosen = sorted(set(recipe.layers)) if recipe.layers is not None else range(n_layers)
    with tqdm(total=len(chosen) * recipe.steps, desc="estimators", unit="step",
              disable=not progress) as bar:
        for layer in range(n_layers):
            estimator = PageEstimator(n_heads, d_head, recipe.width, recipe.distance_buckets)
            weights[layer] = dict(estimator.named_parameters())
            if layer in chosen:
                samples = list(layer_samples(recorded, positions, layer, recipe, scale))

                def on_step(step: int, loss: float, layer: int = layer) -> None:
                    bar.update(1)
                    bar.set_postfix(layer=layer, kl=f"{loss:.3f}")

                result = train_layer(estimator, samples[:-1], samples[-1], recipe, scale,
                                     kv_heads, on_step)
                curves.append({"layer": layer, **result})
            for seen in recorded:  # this layer's tensors are no longer needed
                seen.pop(layer)
    minutes = (time.perf_counter() - started) / 60
    unchanged = all(torch.equal(p, frozen[name]) for name, p in model.state_dict().items())
    meta = {"model": Path(str(model_folder)).name if gguf_file is None else gguf_file,
            "model_sha256": fingerprint, "d_model": config.hidden_size,
            "n_layers": n_layers, "n_heads": n_heads, "d_head": d_head,
            "page": recipe.page, "width": recipe.width, "n_buckets": recipe.distance_buckets,
            "recipe": dataclasses.asdict(recipe)}
    summary = {"bench": "distill-estimators", **meta, "minutes": minutes,
               "threads": torch.get_num_threads(), "cores": available_cores(),
               "torch": torch.__version__, "backbone_unchanged": unchanged,
               "tokens": len(sequences) * recipe.seq_len, "layers": curves}

    def write(folder: Path) -> None:
        from attnlab.distill.estimator_plot import plot_curves
        from attnlab.utils.io import atomic_write_json

        save_estimators(folder / "estimators.safetensors", weights, meta)
        atomic_write_json(folder / "curves.json", summary)
        (folder / "recipe.yaml").write_text(yaml.safe_dump(
            {"estimators": dataclasses.asdict(recipe)}, sort_keys=False))
        plot_curves(summary, folder / "loss.png")

    out.write(write)
    logger.info("distilled %d layers' estimators in %.1f min into %s", n_layers,
                minutes, out_dir)
    return summary
