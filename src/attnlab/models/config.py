"""Configuration of the decoder-only language model."""

from __future__ import annotations

import dataclasses

from attnlab.config import PartSpec
from attnlab.layers import CORES, MLPS, AttentionConfig

NORMS = ("layernorm", "rmsnorm")


@dataclasses.dataclass
class ModelConfig:
    """Decoder-only pre-norm transformer.

    ``max_seq_len`` bounds how many positions one attention call spans (cached or memory
    keys plus current tokens). ``memory_len`` > 0 turns on Transformer-XL memory: that many
    past tokens' keys and values are carried (without gradient) into the next chunk.
    ``vocab_size`` None takes the tokenizer's size. ``norm``: ``layernorm`` (the papers'
    blocks) or ``rmsnorm`` (Llama's), with ``norm_eps``; a Llama block is ``norm: rmsnorm``,
    ``mlp: swiglu``, RoPE and grouped-query ``dense`` projections (``configs/llama/``).
    """

    vocab_size: int | None = None
    d_model: int = 256
    n_layers: int = 4
    d_ff: int = 1024
    dropout: float = 0.0
    tie_embeddings: bool = True
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    max_seq_len: int = 1024
    memory_len: int = 0
    init_scale: float | None = None  # None = sqrt(2 / n_layers) (pre-LN residual scaling)
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)
    mlp: PartSpec = PartSpec("dense")

    def __post_init__(self) -> None:
        self.mlp = PartSpec.parse(self.mlp, "model.mlp")
        if isinstance(self.attention, dict):
            from attnlab.config import from_dict

            self.attention = from_dict(AttentionConfig, self.attention, "model.attention")

    @property
    def d_head(self) -> int:
        return self.attention.d_head or self.d_model // self.attention.n_heads

    @property
    def resolved_init_scale(self) -> float:
        return self.init_scale if self.init_scale is not None else (2.0 / self.n_layers) ** 0.5

    def validate(self) -> None:
        for name in ("d_model", "n_layers", "d_ff", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        if self.attention.d_head is None and self.d_model % self.attention.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.attention.n_heads}; "
                "set attention.d_head explicitly"
            )
        if not 0 <= self.memory_len < self.max_seq_len:
            raise ValueError(
                f"memory_len must be in [0, max_seq_len={self.max_seq_len}), got {self.memory_len}"
            )
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {list(NORMS)}, got {self.norm!r}")
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        core = self.attention.core.name
        if self.memory_len and not CORES.trait(core, "memory"):
            raise ValueError(
                f"core '{core}' cannot attend to Transformer-XL memory (memory_len > 0); "
                f"cores that can: {CORES.names(memory=True)}"
            )
        MLPS.options(self.mlp)
