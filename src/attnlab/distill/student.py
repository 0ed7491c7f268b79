"""The student of an attnlab teacher: same model, another attention core, teacher's weights.

Also: the optimizer's two learning-rate groups (new modules vs pretrained weights) and the
context extension by position interpolation used for the long-context evaluation.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F

from attnlab.config import ConfigError, PartSpec, from_dict, to_dict
from attnlab.layers.sea.estimator import stretched_rows
from attnlab.models import DecoderLM
from attnlab.train.config import RunConfig

NEW_MODULE = ".attn.core."  # parameters of the attention core: what the student adds


class StudentMismatch(ConfigError):
    """A student's weights do not fit its teacher (architecture or checkpoint)."""


def student_config(teacher: RunConfig, attention: PartSpec) -> RunConfig:
    """The teacher's run config with the attention core replaced, validated again (e.g. a
    core that takes no score bias under ``xl`` positions is refused with the reason)."""
    data = to_dict(teacher)
    data["model"]["attention"]["core"] = to_dict(attention)
    return from_dict(RunConfig, data)


def init_student(teacher: DecoderLM, cfg: RunConfig) -> tuple[DecoderLM, list[str]]:
    """A :class:`DecoderLM` of ``cfg`` holding every teacher weight; returns it and the names
    of its freshly initialised parameters (those of the new attention cores).

    Raises :class:`StudentMismatch` when a teacher weight has no place in the student or a
    student weight outside the attention cores has no teacher weight.
    """
    student = DecoderLM(cfg.model)
    try:
        result = student.load_state_dict(teacher.state_dict(), strict=False)
    except RuntimeError as err:  # shape mismatch
        raise StudentMismatch(f"the teacher's weights do not fit the student: {err}") from err
    foreign = [k for k in result.missing_keys if NEW_MODULE not in k]
    if result.unexpected_keys or foreign:
        raise StudentMismatch(
            "the student does not match its teacher: teacher weights without a place "
            f"{result.unexpected_keys[:5]}, student weights without a teacher {foreign[:5]}"
        )
    params = dict(student.named_parameters())
    return student, [k for k in result.missing_keys if k in params]


def param_groups(model: torch.nn.Module, new: list[str], weight_decay: float,
                 new_lr_mult: float, pretrained_lr_mult: float) -> list[dict]:
    """AdamW groups: new / pretrained parameters (each with its ``lr_mult``), matrices
    decayed and vectors not."""
    groups: dict[tuple[bool, bool], list] = {}
    fresh = set(new)
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault((name in fresh, p.dim() >= 2), []).append(p)
    return [
        {"params": ps, "lr_mult": new_lr_mult if is_new else pretrained_lr_mult,
         "weight_decay": weight_decay if decayed else 0.0}
        for (is_new, decayed), ps in groups.items()
    ]


def extend_context(model: DecoderLM, factor: int) -> DecoderLM:
    """A copy of ``model`` that reads ``factor`` times as many positions by interpolation:
    RoPE angles divided by ``factor``, learned absolute tables resized linearly, SEA's causal
    position tables stretched by nearest neighbour (as SEA's long-context runs do)."""
    cfg = copy.deepcopy(model.cfg)
    cfg.max_seq_len *= factor
    positions = cfg.attention.positions
    if positions.name == "rope":
        scale = positions.options.get("interpolation", 1.0) * factor
        cfg.attention.positions = PartSpec("rope", {**positions.options, "interpolation": scale})
    elif positions.name not in ("learned", "none"):
        raise ConfigError(f"positions '{positions.name}' cannot be interpolated; "
                          "supported: rope, learned, none")
    core = cfg.attention.core
    pinned = model.blocks[0].attn.core.derived_options()  # every layer's core is alike
    cfg.attention = dataclasses.replace(
        cfg.attention, core=PartSpec(core.name, {**core.options, **pinned}))
    state = model.state_dict()
    for key, value in state.items():
        if key.endswith("position_table"):
            state[key] = stretched_rows(value, factor, factor * value.shape[0])
        elif key == "pos_embed.weight":
            state[key] = F.interpolate(value.T[None], scale_factor=factor, mode="linear",
                                       align_corners=False)[0].T
    longer = DecoderLM(cfg).to(next(model.parameters()).device)
    longer.load_state_dict(state)
    return longer.eval()
