"""Learning-rate schedules: a function of the step, nothing else (so a resumed run, or one
re-planned to another length while still in its warm-up, follows the same curve)."""

from __future__ import annotations

import math


def warmup(step: int, lr: float, warmup_steps: int) -> float:
    """The linear warm-up's rate at ``step`` (0-based): ``lr * (step + 1) / warmup_steps``."""
    return lr * min(1.0, (step + 1) / max(1, warmup_steps))


def warmup_cosine(step: int, lr: float, warmup_steps: int, total_steps: int,
                  min_lr_ratio: float) -> float:
    """Linear warm-up, then cosine decay from ``lr`` to ``lr * min_lr_ratio`` at
    ``total_steps`` (pretraining: ``attnlab train``)."""
    if step < warmup_steps:
        return warmup(step, lr, warmup_steps)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)


def warmup_constant(step: int, lr: float, warmup_steps: int) -> float:
    """Linear warm-up, then constant (SEA distils at a constant rate: ``attnlab distill``)."""
    return warmup(step, lr, warmup_steps)
