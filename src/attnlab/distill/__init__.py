"""Distillation of a pretrained quadratic model into an efficient-attention student."""

from attnlab.distill.config import DistillConfig, DistillRunConfig, load_distill_config
from attnlab.distill.loop import distill
from attnlab.distill.student import StudentMismatch

__all__ = ["DistillConfig", "DistillRunConfig", "StudentMismatch", "distill",
           "load_distill_config"]
