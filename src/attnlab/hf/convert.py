"""Convert, inspect, save and load transformers models whose attention runs attnlab cores."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from torch import nn

from attnlab.config import ConfigError, PartSpec
from attnlab.hf.attention import (
    ATTN_IMPLEMENTATION,
    COLLECTOR_ATTR,
    CORE_ATTR,
    Collected,
    attach_state_hooks,
)
from attnlab.hf.families import Family, UnsupportedModelError, family_of
from attnlab.hf.native import MODEL_TYPE, AttnlabForCausalLM, weights_file_errors
from attnlab.layers import CORES, AttentionCore, LayerContext
from attnlab.utils.arguments import given, require_type
from attnlab.utils.provenance import model_fingerprint
from attnlab.utils.readers import parse_json, read_json

logger = logging.getLogger(__name__)

CONFIG_KEY = "attnlab"
CORE_KEY_PATTERN = rf"\.{CORE_ATTR}\."
A_MODEL = "a transformers.PreTrainedModel (e.g. from attnlab.hf.load)"


def _family(model: Any) -> Family:
    """The family of ``model``; ``TypeError`` for anything but a transformers model."""
    require_type("model", model, transformers.PreTrainedModel, A_MODEL)
    return family_of(model.config)


def _attention_modules(model: nn.Module, family: Family) -> dict[str, nn.Module]:
    """The model's self-attention modules by name, in layer order."""
    found = {name: m for name, m in model.named_modules()
             if type(m).__name__ == family.attention_class}
    n_layers = model.config.num_hidden_layers
    if len(found) != n_layers:
        raise UnsupportedModelError(
            f"found {len(found)} {family.attention_class} modules in a {n_layers}-layer "
            f"{family.model_type} model: a modified architecture cannot be converted"
        )
    return found


def _layer_stack(model: nn.Module) -> nn.Module:
    """The module that runs the layer list (``LlamaModel``, ``OPTDecoder``, ``GPT2Model``,
    ``BertEncoder``): it is called with the KV cache, so its hooks follow each forward."""
    owners = set()
    for name in _attention_modules(model, _family(model)):
        parts = name.split(".")
        first_index = next(i for i, part in enumerate(parts) if part.isdigit())
        owners.add(".".join(parts[:first_index - 1]))
    if len(owners) != 1:
        raise UnsupportedModelError(f"the attention layers sit in {len(owners)} layer lists "
                                    f"({sorted(owners)}); expected one")
    return model.get_submodule(owners.pop())


def convert(
    model: transformers.PreTrainedModel,
    core: str = "sea",
    options: Mapping[str, Any] | None = None,
    *,
    max_seq_len: int | None = None,
) -> transformers.PreTrainedModel:
    """Make every self-attention layer of ``model`` run an attnlab core (in place).

    Each attention module keeps its projections (and RoPE / cache handling) and gets a fresh
    core, ``CORES.build(PartSpec(core, options))``, as its submodule ``attnlab_core`` (so
    its weights are in the state dict and ``save_pretrained`` saves them); the model switches
    to ``attn_implementation="attnlab"`` and its config records ``attnlab: {core, options,
    max_seq_len}`` for :func:`load`. Cores are causal exactly where the model's attention is.

    Args:
        model: a supported transformers model (see :mod:`attnlab.hf.families`).
        core: a registered core name: ``sea``, ``performer``, ``reformer``, or the exact
            ``sdpa`` / ``eager`` (parity checks).
        options: the core's options (e.g. ``{"k": 64, "predictor_length": 64}`` for SEA),
            validated with close-key hints.
        max_seq_len: positions the cores are sized for (SEA's causal position table, the
            Reformer's bucket count); default: the config's ``max_position_embeddings``.

    Returns:
        ``model`` itself.
    """
    family = _family(model)
    require_type("core", core, str, "a str (a registered core's name, e.g. 'sea')")
    require_type("options", options, (Mapping, type(None)),
                 "a mapping (dict) of the core's options, or None")
    require_type("max_seq_len", max_seq_len, (int, type(None)), "an int (positions), or None")
    if max_seq_len is not None and max_seq_len < 1:
        raise ValueError(f"max_seq_len must be at least 1, got {max_seq_len}")
    modules = list(_attention_modules(model, family).values())
    if any(hasattr(m, CORE_ATTR) for m in modules):
        raise ValueError("this model is already converted; use attnlab.hf.set_inference to "
                         "change SEA's k or query skip")
    spec = PartSpec(core, dict(options or {}))
    CORES.options(spec)  # validate before building anything
    config = model.config
    n_heads = config.num_attention_heads
    max_len = max_seq_len or config.max_position_embeddings
    for layer, module in enumerate(modules):
        ctx = LayerContext(
            d_model=config.hidden_size, n_heads=n_heads,
            d_head=getattr(config, "head_dim", None) or config.hidden_size // n_heads,
            causal=bool(module.is_causal), max_seq_len=max_len, layer_idx=layer,
            n_layers=len(modules), init_scale=1.0,
        )
        weight = next(module.parameters())
        built = CORES.build(spec, ctx=ctx, dropout=0.0).to(device=weight.device, dtype=weight.dtype)
        module.add_module(CORE_ATTR, built.train(module.training))
    setattr(config, CONFIG_KEY, {"core": spec.name, "options": dict(spec.options),
                                 "max_seq_len": max_len})
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    attach_state_hooks(_layer_stack(model))
    logger.info("converted %d %s layers to the %s core", len(modules), family.model_type,
                spec.name)
    return model


def cores(model: transformers.PreTrainedModel) -> list[AttentionCore]:
    """The attnlab core of each layer, in layer order, of a converted model."""
    found = [getattr(m, CORE_ATTR, None)
             for m in _attention_modules(model, _family(model)).values()]
    if any(c is None for c in found):
        raise ValueError("this model has not been converted: call attnlab.hf.convert first")
    return found


def set_inference(
    model: transformers.PreTrainedModel, *, k: int | None = None, query_skip: int | None = None
) -> None:
    """Set SEA's key budget (dynamic k) and/or query skip on every layer, no retraining; the
    config's ``attnlab`` entry follows, so a saved model reloads with these settings."""
    layer_cores = cores(model)
    entry = getattr(model.config, CONFIG_KEY)
    if not all(c.traits["tunable_inference"] for c in layer_cores):
        raise ValueError(f"the {entry['core']} core has no inference settings; cores that "
                         f"have: {CORES.names(tunable_inference=True)}")
    for c in layer_cores:
        c.set_inference(k=k, query_skip=query_skip)
    changed = {"k": k, "query_skip": query_skip}
    entry["options"].update({name: v for name, v in changed.items() if v is not None})


@contextlib.contextmanager
def collect(model: transformers.PreTrainedModel) -> Iterator[Collected]:
    """Collect the cores' auxiliary losses of the forwards run inside the block.

    >>> with collect(model) as record:
    ...     loss = model(ids, labels=ids).loss + record.total()
    """
    cores(model)  # must be converted
    stack = _layer_stack(model)
    previous = getattr(stack, COLLECTOR_ATTR, None)
    record = Collected()
    setattr(stack, COLLECTOR_ATTR, record)
    try:
        yield record
    finally:
        setattr(stack, COLLECTOR_ATTR, previous)


def check_student(
    student: transformers.PreTrainedModel, teacher: transformers.PreTrainedModel
) -> None:
    """Raise ``ValueError`` unless ``student`` (a converted model) has ``teacher``'s
    architecture and weight shapes (attnlab cores aside)."""

    def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in model.state_dict().items()
                if f".{CORE_ATTR}." not in name}

    require_type("student", student, transformers.PreTrainedModel, A_MODEL)
    require_type("teacher", teacher, transformers.PreTrainedModel, A_MODEL)
    s_type, t_type = student.config.model_type, teacher.config.model_type
    if s_type != t_type:
        raise ValueError(f"the student is a {s_type} model but the teacher a {t_type} model")
    mine, theirs = shapes(student), shapes(teacher)
    problems = [f"{n}: student {mine[n]} vs teacher {theirs[n]}"
                for n in sorted(mine.keys() & theirs.keys()) if mine[n] != theirs[n]]
    problems += [f"{n}: only in the teacher" for n in sorted(theirs.keys() - mine.keys())]
    problems += [f"{n}: only in the student" for n in sorted(mine.keys() - theirs.keys())]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError("the student does not match its teacher: " + "; ".join(problems[:5])
                         + more)


@contextlib.contextmanager
def _core_keys_expected(cls: type) -> Iterator[None]:
    """Let ``cls.from_pretrained`` skip the checkpoint's core weights without a warning (they
    are loaded after conversion); restores the class attribute afterwards."""
    name = "_keys_to_ignore_on_load_unexpected"
    own = cls.__dict__.get(name, None)
    had = name in cls.__dict__
    setattr(cls, name, [*(getattr(cls, name, None) or []), CORE_KEY_PATTERN])
    try:
        yield
    finally:
        if had:
            setattr(cls, name, own)
        else:
            delattr(cls, name)


def _weight_files(folder: Path) -> list[str]:
    """The safetensors files of the checkpoint in ``folder``: those its index names (read
    before transformers reads it, so that a damaged index is named), else
    ``model.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return ["model.safetensors"]
    expected = "a sharded checkpoint's index (its weight_map names each tensor's file)"
    weight_map = read_json(index, expected).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str)
                                                   for v in weight_map.values()):
        raise ValueError(f"{index}: no weight_map of file names; expected {expected}")
    return sorted(set(weight_map.values()))


def _checkpoint_core_tensors(folder: Path, files: list[str]) -> dict[str, torch.Tensor]:
    """The ``attnlab_core`` tensors of a (possibly sharded) safetensors checkpoint."""
    tensors = {}
    for name in files:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing: the checkpoint is incomplete "
                                    "(attnlab.hf.load reads safetensors checkpoints)")
        with safe_open(folder / name, framework="pt") as fh:
            for key in fh.keys():
                if f".{CORE_ATTR}." in key:
                    tensors[key] = fh.get_tensor(key)
    return tensors


def _load_core_state(model: nn.Module, folder: Path, files: list[str]) -> None:
    """Load the converted model's core weights from ``files`` in ``folder``, all of them,
    shapes checked."""
    own = {k: v for k, v in model.state_dict().items() if f".{CORE_ATTR}." in k}
    saved = _checkpoint_core_tensors(folder, files)
    problems = [f"{k}: checkpoint {tuple(saved[k].shape)} vs model {tuple(own[k].shape)}"
                for k in sorted(own.keys() & saved.keys()) if saved[k].shape != own[k].shape]
    problems += [f"{k}: missing from the checkpoint" for k in sorted(own.keys() - saved.keys())]
    problems += [f"{k}: not in the model" for k in sorted(saved.keys() - own.keys())]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError(f"{folder}: the saved attnlab cores do not match the model its config "
                         "describes: " + "; ".join(problems[:5]) + more)
    model.load_state_dict(saved, strict=False)


def load_fingerprinted(path: str | os.PathLike[str], gguf_file: str | None = None
                       ) -> tuple[transformers.PreTrainedModel, str]:
    """The model of a folder (:func:`load`) and its files' fingerprint
    (:func:`~attnlab.utils.provenance.model_fingerprint`), for commands that record what they
    measured; ``ConfigError`` naming the folder when it is missing, broken or unsupported."""
    try:
        check_model_folder(path, gguf_file)
        return load(path, gguf_file=gguf_file), model_fingerprint(path, gguf_file)
    except (OSError, UnsupportedModelError) as err:
        raise ConfigError(f"model {str(path)!r}: {err}") from err


def check_model_folder(path: str | os.PathLike[str], gguf_file: str | None = None) -> Path:
    """``path`` as a ``Path`` if it is a model folder :func:`load` can read (``gguf_file``:
    holding that GGUF file, else ``config.json``); ``FileNotFoundError`` saying what is
    missing (for a GGUF file, the ones that are there)."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"no model folder at {folder}")
    if gguf_file and not (folder / gguf_file).is_file():
        present = sorted(p.name for p in folder.glob("*.gguf"))
        raise FileNotFoundError(f"the GGUF file {gguf_file} is not in {folder}; the .gguf "
                                f"files there: {', '.join(present) or 'none'}")
    if not gguf_file and not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder / 'config.json'} is missing: not a Hugging Face "
                                "model folder")
    return folder


def load_tokenizer(path: str | os.PathLike[str], *, gguf_file: str | None = None
                   ) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer of the model folder ``path`` (``AutoTokenizer``; ``gguf_file``: from
    that GGUF file), with a damaged tokenizer file named: ``ValueError`` for a JSON file of
    the folder that is not JSON, else for a tokenizer transformers cannot build."""
    folder = check_model_folder(path, gguf_file)
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        return transformers.AutoTokenizer.from_pretrained(folder, **extra)
    except (OSError, ImportError):  # a missing file or package: already said in one line
        raise
    except Exception as err:  # transformers and tokenizers raise many types for a bad file
        for file in sorted(folder.glob("*.json")):  # the file, when one is not JSON
            parse_json(file, "a JSON file of a Hugging Face model folder",
                       "; copy or download the model again")
        raise ValueError(f"{folder}: transformers cannot build the model's tokenizer "
                         f"({type(err).__name__}: {err}); copy or download the model "
                         "again") from err


def load(
    path: str | Path,
    *,
    gguf_file: str | None = None,
    teacher: transformers.PreTrainedModel | None = None,
    dtype: torch.dtype = torch.float32,
    model_class: type | None = None,
    **kwargs: Any,
) -> transformers.PreTrainedModel:
    """Load a Hugging Face model folder of a supported architecture, offline.

    A folder saved (``save_pretrained``) after :func:`convert` comes back converted, with its
    trained cores; an exported attnlab model (``model_type: attnlab``) as
    :class:`~attnlab.hf.native.AttnlabForCausalLM`; any other model folder loads as the plain
    (teacher) model.

    Args:
        path: the model folder.
        gguf_file: a GGUF file in ``path`` to load (dequantised) instead of safetensors.
        teacher: if given, the loaded model must match it (:func:`check_student`).
        dtype: parameter dtype.
        model_class: the transformers class to load with; default: the config's
            ``architectures[0]``, else the family's default (e.g. ``LlamaForCausalLM``).
        kwargs: passed to ``from_pretrained``.
    """
    require_type("path", path, (str, os.PathLike), "a str or os.PathLike (the model folder)")
    require_type("gguf_file", gguf_file, (str, type(None)),
                 "a str (a GGUF file's name in the folder), or None")
    require_type("teacher", teacher, (transformers.PreTrainedModel, type(None)),
                 f"{A_MODEL}, or None")
    require_type("dtype", dtype, torch.dtype, "a torch.dtype, e.g. torch.bfloat16")
    if model_class is not None and not (isinstance(model_class, type) and issubclass(
            model_class, transformers.PreTrainedModel)):
        raise TypeError(f"model_class must be a subclass of transformers.PreTrainedModel, e.g. "
                        f"transformers.LlamaForCausalLM, or None, got {given(model_class)}")
    folder = check_model_folder(path, gguf_file)
    files = [] if gguf_file else _weight_files(folder)
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    config = transformers.AutoConfig.from_pretrained(folder, **extra)
    if config.model_type == MODEL_TYPE:  # attnlab's own model (attnlab export)
        return AttnlabForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    family = family_of(config)
    cls = model_class or getattr(transformers, (config.architectures or [family.default_class])[0])
    saved = getattr(config, CONFIG_KEY, None)
    expect = _core_keys_expected(cls) if saved else contextlib.nullcontext()
    with expect, weights_file_errors(folder):
        model = cls.from_pretrained(folder, dtype=dtype, **extra, **kwargs)
    if gguf_file:  # dequantised: drop the quantizer so that save_pretrained works
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
    if saved:
        convert(model, saved["core"], saved["options"], max_seq_len=saved["max_seq_len"])
        # keep what else the folder recorded (e.g. the distillation length)
        setattr(model.config, CONFIG_KEY, {**saved, **getattr(model.config, CONFIG_KEY)})
        _load_core_state(model, folder, files)
    if teacher is not None:
        check_student(model, teacher)
    return model
