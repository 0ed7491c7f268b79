"""The transformers architectures ``attnlab.hf`` converts, and the configs it refuses.

Each family names the class of its self-attention modules (the modules that call
transformers' attention registry) and the model class a checkpoint loads with when its
config names no architecture (GGUF files).
"""

from __future__ import annotations

import dataclasses
from typing import Any


class UnsupportedModelError(ValueError):
    """The model's architecture or config cannot run attnlab attention cores."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One supported architecture: ``model_type`` as in its config, the class name of its
    self-attention modules and the transformers class used when a config lists no
    ``architectures``."""

    model_type: str
    attention_class: str
    default_class: str
    example: str


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "LlamaAttention", "LlamaForCausalLM",
               "Llama 2/3, SmolLM2, TinyLlama (grouped-query attention)"),
        Family("opt", "OPTAttention", "OPTForCausalLM", "OPT-125M ... 66B"),
        Family("gpt2", "GPT2Attention", "GPT2LMHeadModel", "GPT-2, DistilGPT-2"),
        Family("bert", "BertSelfAttention", "BertModel",
               "BERT, MiniLM sentence encoders (bidirectional)"),
    )
}


def supported() -> str:
    """One line naming the supported model types and examples, for error messages."""
    return "; ".join(f"{f.model_type} ({f.example})" for f in FAMILIES.values())


def family_of(config: Any) -> Family:
    """The :class:`Family` of a transformers config; raises :class:`UnsupportedModelError`
    for other architectures and for configs whose attention attnlab cannot replace."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        names = getattr(config, "architectures", None) or [model_type]
        raise UnsupportedModelError(
            f"attnlab.hf cannot convert {'/'.join(map(str, names))} (model_type "
            f"{model_type!r}); supported model types: {supported()}"
        )
    problems = []
    if getattr(config, "is_encoder_decoder", False):
        problems.append("is_encoder_decoder=True (encoder-decoder models)")
    if getattr(config, "add_cross_attention", False):
        problems.append("add_cross_attention=True (cross-attention layers)")
    if problems:
        raise UnsupportedModelError(
            f"this {model_type} config cannot be converted: {', '.join(problems)}; attnlab "
            "cores replace self-attention over the model's own tokens only"
        )
    return FAMILIES[model_type]
