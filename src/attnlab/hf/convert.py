"""Convert, inspect, save and load transformers models whose attention runs attnlab cores."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import safe_open
from torch import nn

from attnlab.config import PartSpec
from attnlab.hf.attention import (
    ATTN_IMPLEMENTATION,
    COLLECTOR_ATTR,
    CORE_ATTR,
    Collected,
    attach_state_hooks,
)
from attnlab.hf.families import Family, UnsupportedModelError, family_of
from attnlab.hf.native import MODEL_TYPE, AttnlabForCausalLM
from attnlab.layers import CORES, AttentionCore, LayerContext

logger = logging.getLogger(__name__)

CONFIG_KEY = "attnlab"
CORE_KEY_PATTERN = rf"\.{CORE_ATTR}\."


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
    for name in _attention_modules(model, family_of(model.config)):
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
    family = family_of(model.config)
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
             for m in _attention_modules(model, family_of(model.config)).values()]
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


def _checkpoint_core_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The ``attnlab_core`` tensors of a (possibly sharded) safetensors checkpoint."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
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


def _load_core_state(model: nn.Module, folder: Path) -> None:
    """Load the converted model's core weights from ``folder``, all of them, shapes checked."""
    own = {k: v for k, v in model.state_dict().items() if f".{CORE_ATTR}." in k}
    saved = _checkpoint_core_tensors(folder)
    problems = [f"{k}: checkpoint {tuple(saved[k].shape)} vs model {tuple(own[k].shape)}"
                for k in sorted(own.keys() & saved.keys()) if saved[k].shape != own[k].shape]
    problems += [f"{k}: missing from the checkpoint" for k in sorted(own.keys() - saved.keys())]
    problems += [f"{k}: not in the model" for k in sorted(saved.keys() - own.keys())]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError(f"{folder}: the saved attnlab cores do not match the model its config "
                         "describes: " + "; ".join(problems[:5]) + more)
    model.load_state_dict(saved, strict=False)


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
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"no model folder at {folder}")
    marker = folder / (gguf_file or "config.json")
    if not marker.is_file():
        raise FileNotFoundError(f"{marker} is missing: not a Hugging Face model folder")
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    config = transformers.AutoConfig.from_pretrained(folder, **extra)
    if config.model_type == MODEL_TYPE:  # attnlab's own model (attnlab export)
        return AttnlabForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    family = family_of(config)
    cls = model_class or getattr(transformers, (config.architectures or [family.default_class])[0])
    saved = getattr(config, CONFIG_KEY, None)
    expect = _core_keys_expected(cls) if saved else contextlib.nullcontext()
    with expect:
        model = cls.from_pretrained(folder, dtype=dtype, **extra, **kwargs)
    if gguf_file:  # dequantised: drop the quantizer so that save_pretrained works
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
    if saved:
        convert(model, saved["core"], saved["options"], max_seq_len=saved["max_seq_len"])
        # keep what else the folder recorded (e.g. the distillation length)
        setattr(model.config, CONFIG_KEY, {**saved, **getattr(model.config, CONFIG_KEY)})
        _load_core_state(model, folder)
    if teacher is not None:
        check_student(model, teacher)
    return model
