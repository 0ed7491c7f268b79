"""The run config: model + data + train sections, loaded from YAML with overrides."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.config import ConfigError, apply_override, from_dict, load_yaml
from attnlab.data.config import DataConfig
from attnlab.models.config import ModelConfig
from attnlab.train.distributed import MODES


@dataclasses.dataclass
class TrainConfig:
    """Optimisation and bookkeeping of one training run."""

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 = off
    bf16: bool = False  # bfloat16 autocast
    sampling: str = "auto"  # random | sequential | auto (sequential when model.memory_len > 0)
    eval_every: int = 200  # 0 = only at the end
    eval_tokens: int = 65536  # tokens of the valid split per periodic evaluation
    final_eval_tokens: int | None = None  # None = the whole valid split
    eval_batch_size: int = 8
    ckpt_every: int = 500  # 0 = only at the end
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | None = None  # torch CPU threads (None = torch's default)
    tensorboard: bool = False
    distributed: str = "ddp"  # under torchrun: ddp (replicated) | fsdp (sharded, FSDP2)
    find_unused_parameters: bool = False  # ddp: for parameters that get no gradient (Reformer)

    def validate(self) -> None:
        positive = ("steps", "batch_size", "seq_len", "grad_accum", "eval_batch_size", "log_every")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "ckpt_every", "grad_clip", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.sampling not in ("auto", "random", "sequential"):
            raise ValueError(f"sampling must be auto, random or sequential, got {self.sampling!r}")
        if self.distributed not in MODES:
            raise ValueError(
                f"distributed must be one of {', '.join(MODES)}, got {self.distributed!r}"
            )


@dataclasses.dataclass
class RunConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)

    def validate(self) -> None:
        span = self.train.seq_len + self.model.memory_len
        if span > self.model.max_seq_len:
            raise ConfigError(
                f"train.seq_len ({self.train.seq_len}) + model.memory_len ({self.model.memory_len})"
                f" = {span} exceeds model.max_seq_len ({self.model.max_seq_len})"
            )
        if self.model.memory_len and self.train.sampling == "random":
            raise ConfigError(
                "model.memory_len > 0 (Transformer-XL memory) needs consecutive chunks: set "
                "train.sampling to sequential or auto"
            )

    @property
    def sequential(self) -> bool:
        return self.train.sampling == "sequential" or (
            self.train.sampling == "auto" and self.model.memory_len > 0
        )


def load_run_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    base: dict[str, Any] | None = None,
) -> RunConfig:
    """RunConfig from a YAML file (or ``base`` dict), then ``key.path=value`` overrides."""
    data = load_yaml(path) if path is not None else dict(base or {})
    if "distill" in data:
        raise ConfigError(
            f"{path or 'the config'} is a distillation config (it has a 'distill' section); "
            "run it with `attnlab distill --config`, or give a training config "
            "(sections: data, model, train)"
        )
    if "estimators" in data:
        raise ConfigError(
            f"{path or 'the config'} is an estimator recipe (it has an 'estimators' section); "
            "run it with `attnlab distill-estimators --config`, or give a training config "
            "(sections: data, model, train)"
        )
    for assignment in overrides:
        apply_override(data, assignment)
    return from_dict(RunConfig, data)
