"""Re-open a finished (or checkpointed) run: its config, tokenizer and trained model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from attnlab.config import ConfigError
from attnlab.data import Tokenizer, load_tokenizer
from attnlab.models import DecoderLM
from attnlab.train.checkpoint import load_checkpoint
from attnlab.train.config import RunConfig, load_run_config


@dataclasses.dataclass
class LoadedRun:
    cfg: RunConfig
    model: DecoderLM
    tokenizer: Tokenizer
    step: int


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> LoadedRun:
    """Load ``run_dir``'s resolved config, tokenizer and newest checkpoint (eval mode)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not an attnlab run folder (no config.yaml)")
    cfg = load_run_config(run_dir / "config.yaml")
    tokenizer = load_tokenizer(run_dir)
    model = DecoderLM(cfg.model)
    ckpt = load_checkpoint(run_dir, model, map_location=device)
    return LoadedRun(cfg, model.to(device).eval(), tokenizer, ckpt.step)
