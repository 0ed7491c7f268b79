"""What ``attnlab visualize`` looks inside: a model, its teacher (if any) and a text's tokens.

The model comes from an attnlab run folder (``attnlab train``, or ``attnlab distill`` of an
attnlab teacher), a distillation folder of a Hugging Face teacher (``OUT/student``) or a
Hugging Face model folder (a student saved by :func:`attnlab.hf.convert`). The teacher is
the one the distillation recorded in ``distill.yaml`` unless one is given; a Hugging Face
teacher is converted to the exact ``sdpa`` core so that its attention can be read.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config import ConfigError, load_yaml
from attnlab.layers.base import AttentionCore

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Subject:
    """A model to look inside, on one text.

    model / teacher: eval-mode models (teacher None: none known); ids: ``[1, T]`` the text's
    tokens; labels: each token as text; cores: the attention core of each layer of a model
    (attnlab or converted Hugging Face); forward: runs a model on ``ids``.
    """

    model: nn.Module
    teacher: nn.Module | None
    ids: Tensor
    labels: list[str]
    cores: Callable[[nn.Module], list[AttentionCore]]
    forward: Callable[[nn.Module, Tensor], Any]

    def run(self, model: nn.Module) -> None:
        """One forward of ``model`` on the text, without gradients."""
        with torch.no_grad():
            self.forward(model, self.ids)


def _recorded_teacher(folder: Path) -> str | None:
    """The teacher ``attnlab distill`` recorded in ``folder/distill.yaml``, or None."""
    path = folder / "distill.yaml"
    if not path.is_file():
        return None
    section = load_yaml(path).get("distill")
    teacher = section.get("teacher") if isinstance(section, dict) else None
    if teacher is not None and not isinstance(teacher, str):
        raise ConfigError(f"{path}: distill.teacher is {teacher!r}; expected the teacher's "
                          "folder (a string), as attnlab distill records it")
    return teacher


def _within(max_tokens: int, limit: int | None) -> int:
    """``max_tokens``, or the model's length limit if that is less (logged)."""
    if limit is not None and max_tokens > limit:
        logger.info("the model reads at most %d tokens: using the first %d", limit, limit)
        return limit
    return max_tokens


def _encode_attnlab(tokenizer: Any, text: str, max_tokens: int) -> tuple[list[int], list[str]]:
    ids = tokenizer.encode(text)[:max_tokens]
    return ids, [tokenizer.decode([i]) for i in ids]


def _attnlab_subject(folder: Path, teacher: str | None, given: bool, text: str,
                     max_tokens: int, device: str) -> Subject:
    from attnlab.distill.record import model_cores
    from attnlab.train.run import load_run

    run = load_run(folder, device)
    teacher_model = None
    if teacher is not None:
        teacher_folder = Path(teacher)
        if not (teacher_folder / "config.yaml").is_file():
            if given:
                raise ConfigError(f"teacher {teacher}: not an attnlab run folder (no "
                                  f"config.yaml); {folder} is an attnlab model, so its teacher "
                                  "is the attnlab run it was distilled from")
            logger.warning("teacher %s is not an attnlab run folder (moved?): showing the "
                           "model's own exact attention instead", teacher)
        else:
            teacher_model = load_run(teacher_folder, device).model
    ids, labels = _encode_attnlab(run.tokenizer, text,
                                  _within(max_tokens, run.cfg.model.max_seq_len))
    return Subject(run.model, teacher_model, _as_batch(ids, device), labels, model_cores,
                   lambda model, x: model(x))


def _hf_subject(model_folder: Path, teacher: str | None, text: str, max_tokens: int,
                device: str) -> Subject:
    import attnlab.hf
    from attnlab.distill.hf import resolve_teacher

    model = attnlab.hf.load(model_folder).to(device).eval()
    try:
        attnlab.hf.cores(model)
    except ValueError as err:
        raise ConfigError(f"{model_folder} is a Hugging Face model with its own attention "
                          "(not converted by attnlab): nothing of attnlab's to show") from err
    teacher_model = None
    if teacher is not None:
        teacher_model = attnlab.hf.convert(attnlab.hf.load(resolve_teacher(teacher)), "sdpa")
        teacher_model = teacher_model.to(device).eval()
    tokenizer = attnlab.hf.load_tokenizer(model_folder)
    limit = getattr(model.config, "max_position_embeddings", None)
    ids = tokenizer(text, truncation=True, max_length=_within(max_tokens, limit))["input_ids"]
    return Subject(model, teacher_model, _as_batch(ids, device),
                   tokenizer.convert_ids_to_tokens(ids), attnlab.hf.cores,
                   lambda model, x: model(input_ids=x))


def _as_batch(ids: list[int], device: str) -> Tensor:
    if not ids:
        raise ConfigError("the text encodes to no tokens")
    return torch.tensor([ids], device=device)


def open_subject(path: str | Path, text: str, *, teacher: str | None = None,
                 max_tokens: int = 96, device: str = "cpu") -> Subject:
    """The model at ``path`` (see the module docstring) on ``text``'s first ``max_tokens``
    tokens (at most what the model reads). ``teacher``: a teacher folder (attnlab run or
    Hugging Face model) to compare with, instead of the recorded one. Raises ``ConfigError``
    for a path that holds no model and for a given teacher that cannot be used (a recorded
    attnlab teacher that has moved is passed over with a warning)."""
    folder = Path(path)
    given = teacher is not None
    teacher = teacher or _recorded_teacher(folder)
    if (folder / "config.yaml").is_file():
        return _attnlab_subject(folder, teacher, given, text, max_tokens, device)
    if (folder / "distill.yaml").is_file() and (folder / "student" / "config.json").is_file():
        return _hf_subject(folder / "student", teacher, text, max_tokens, device)
    if (folder / "config.json").is_file():
        return _hf_subject(folder, teacher, text, max_tokens, device)
    raise ConfigError(f"{folder}: not an attnlab run folder (config.yaml), a distillation "
                      "folder (distill.yaml and student/) nor a Hugging Face model folder "
                      "(config.json)")
