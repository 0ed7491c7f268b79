"""Language models built from attnlab layers."""

from attnlab.models.config import ModelConfig
from attnlab.models.lm import DecoderLM, LMOutput, ModelCache

__all__ = ["DecoderLM", "LMOutput", "ModelCache", "ModelConfig"]
