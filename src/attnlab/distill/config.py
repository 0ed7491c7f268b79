"""Settings of ``attnlab distill``: the teacher, the student's attention, and the recipe.

The recipe follows SEA's (arXiv:2310.01777, its distillation section): the student starts from the
teacher's weights, new attention modules freshly initialised; the loss is
``ce_weight * CE + hidden_weight * mean_l MSE(hidden_l) + logits_weight * KL(logits) +
attention_weight * mean_l (estimate + attention + context terms)``; the new modules learn at
``lr * new_lr_mult`` and the pretrained weights at ``lr * pretrained_lr_mult``, constant after
a linear warm-up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.config import ConfigError, PartSpec, apply_override, from_dict, load_yaml
from attnlab.data.config import DataConfig
from attnlab.distill.recipes import RECIPES, apply_recipe
from attnlab.results import MIN_REPS


@dataclasses.dataclass
class DistillConfig:
    """``teacher``: an attnlab run folder, or a Hugging Face model folder (``gguf_file``: a
    GGUF file in it to load, dequantised) or name in the local Hugging Face cache.
    ``student_attention``: the student's attention core (a registry name, or a mapping with
    its options, e.g. ``{name: sea, k: 16}``). ``seq_len``: None = the teacher's training
    length (attnlab) or its positions up to 1024 (Hugging Face). ``dynamic_k`` /
    ``query_skip``: the SEA inference settings evaluated after training (None = k/2, k, 2k);
    ``grid_reps``: timed rounds of each setting's latency and peak memory, side by side with
    the teacher (:mod:`attnlab.distill.grid`; 0 = quality only, else at least 5).
    ``long_context``: also evaluate teacher and student at this multiple of ``seq_len``
    (attnlab: after position interpolation; Hugging Face: within the model's own positions,
    else recorded as skipped; 1 = skip). ``context_weight``: weight of the attention-output
    MSE inside the attention term. ``recipe``: whose defaults fill the unset keys
    (:mod:`attnlab.distill.recipes`: ``attnlab`` or ``sea-paper``)."""

    recipe: str = "attnlab"
    teacher: str = ""
    gguf_file: str | None = None
    student_attention: PartSpec = PartSpec("sea")
    steps: int = 300
    batch_size: int = 8
    seq_len: int | None = None
    lr: float = 1e-4
    new_lr_mult: float = 10.0
    pretrained_lr_mult: float = 0.2
    warmup_steps: int = 20
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ce_weight: float = 0.1
    hidden_weight: float = 5.0
    logits_weight: float = 0.2
    attention_weight: float = 1.0
    context_weight: float = 1.0
    eval_every: int = 100
    eval_tokens: int = 32768
    final_eval_tokens: int | None = 131072
    eval_batch_size: int = 8
    dynamic_k: list[int] | None = None
    query_skip: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4])
    grid_reps: int = 5
    long_context: int = 2
    ckpt_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        self.student_attention = PartSpec.parse(self.student_attention,
                                                "distill.student_attention")

    def validate(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {list(RECIPES)}, got {self.recipe!r}")
        if self.gguf_file is not None and not self.gguf_file.strip():
            raise ValueError("gguf_file is empty: name a GGUF file in the teacher's folder, or "
                             "leave it unset (null)")
        for name in ("steps", "batch_size", "eval_batch_size", "log_every", "long_context",
                     "eval_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "ckpt_every", "keep_checkpoints",
                     "grad_clip", "weight_decay", "ce_weight", "hidden_weight", "logits_weight",
                     "attention_weight", "context_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or self.new_lr_mult <= 0 or self.pretrained_lr_mult < 0:
            raise ValueError("lr and new_lr_mult must be > 0 and pretrained_lr_mult >= 0")
        for name in ("seq_len", "final_eval_tokens"):
            if (value := getattr(self, name)) is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or null), got {value}")
        if self.grid_reps and self.grid_reps < MIN_REPS:
            raise ValueError(f"grid_reps must be 0 (no timing) or >= {MIN_REPS}, got "
                             f"{self.grid_reps}")
        if self.dynamic_k == [] or not self.query_skip:  # [] would mean the defaults / no grid
            raise ValueError("dynamic_k (null: k/2, k, 2k) and query_skip must not be empty "
                             "lists")
        if any(x < 1 for x in [*(self.dynamic_k or []), *self.query_skip]):
            raise ValueError("dynamic_k and query_skip values must be >= 1")


@dataclasses.dataclass
class DistillRunConfig:
    """``distill``: the recipe; ``data``: None = the teacher's data settings (attnlab
    teachers) or built-in text for Hugging Face teachers."""

    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)
    data: DataConfig | None = None


def load_distill_config(path: str | Path | None = None,
                        overrides: Sequence[str] = (),
                        base: dict[str, Any] | None = None) -> DistillRunConfig:
    """From a YAML file (or ``base``), then ``key.path=value`` overrides (``distill.k=...``,
    ``data.corpus=...``), then the recipe's defaults for what is still unset."""
    data = load_yaml(path) if path is not None else dict(base or {})
    for assignment in overrides:
        apply_override(data, assignment)
    section = data.setdefault("distill", {})
    if isinstance(section, dict):  # anything else: from_dict says what is wrong
        apply_recipe(section)
    _check_teacher_tokenizer(data.get("data"))
    return from_dict(DistillRunConfig, data)


def _check_teacher_tokenizer(data: Any) -> None:
    """A distillation encodes text with the teacher's tokenizer: a ``data.tokenizer`` or
    ``data.vocab_size`` other than the defaults (which its record carries) would be recorded
    and not run."""
    if not isinstance(data, dict):
        return
    defaults = DataConfig()
    for key in ("tokenizer", "vocab_size"):
        if key in data and data[key] != getattr(defaults, key):
            raise ConfigError(f"data.{key}={data[key]!r}: a distillation encodes text with "
                              f"the teacher's own tokenizer; drop data.{key}")
