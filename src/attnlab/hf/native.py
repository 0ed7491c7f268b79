"""attnlab's own language model as a Hugging Face model (``model_type: attnlab``).

:class:`AttnlabForCausalLM` wraps a :class:`~attnlab.models.DecoderLM` (any projections,
core, positions and MLP attnlab builds) behind transformers' interface: ``from_pretrained`` /
``save_pretrained`` (safetensors), ``generate`` with the model's own KV cache (its
:class:`~attnlab.models.ModelCache` is the ``cache`` transformers hands back to it, so every
core's decoding state works as in ``attnlab generate``) and the loss with ``labels``.
Importing :mod:`attnlab.hf` registers it with ``AutoConfig``, ``AutoModel`` and
``AutoModelForCausalLM`` (the model is the language model either way).
:func:`attnlab.hf.export.export_run` writes an ``attnlab train`` run as such a folder.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    GenerationMixin,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import CausalLMOutputWithPast

from attnlab.config import from_dict, to_dict
from attnlab.models import DecoderLM, ModelCache, ModelConfig

MODEL_TYPE = "attnlab"


class AttnlabConfig(PreTrainedConfig):
    """``attnlab_model``: the :class:`~attnlab.models.ModelConfig` as a plain mapping."""

    model_type = MODEL_TYPE
    attnlab_model: dict | None = None
    vocab_size: int | None = None
    tie_word_embeddings: bool = True

    def model_config(self) -> ModelConfig:
        if self.attnlab_model is None:
            raise ValueError("this AttnlabConfig holds no attnlab_model")
        cfg = from_dict(ModelConfig, dict(self.attnlab_model), "attnlab_model")
        cfg.validate()
        return cfg


class AttnlabForCausalLM(PreTrainedModel, GenerationMixin):
    """A :class:`~attnlab.models.DecoderLM` (``.model``) as a transformers causal LM."""

    config_class = AttnlabConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}

    def __init__(self, config: AttnlabConfig) -> None:
        super().__init__(config)
        self.model = DecoderLM(config.model_config())
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike[str],
                        *args: Any, **kwargs: Any) -> AttnlabForCausalLM:
        """transformers' ``from_pretrained`` (``AutoModel`` and ``AutoModelForCausalLM``
        come here too), with a truncated or corrupt weights file named
        (:func:`weights_file_errors`)."""
        with weights_file_errors(pretrained_model_name_or_path):
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate keeps the model's own ModelCache

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Parameters: nothing (attnlab's modules initialise themselves when built, and
        ``from_pretrained`` loads them); derived unsaved buffers (RoPE's frequencies,
        ALiBi's slopes) are recomputed, as a meta-device build leaves them empty."""
        if callable(init := getattr(module, "init_buffers", None)):
            init()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.model.lm_head

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        cache: ModelCache | None = None,
        use_cache: bool | None = None,
        labels: Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """``input_ids [B, T]`` after the ``cache``'s tokens; ``attention_mask`` ``[B, T]`` or
        ``[B, cached + T]`` (1 = real token); ``labels`` ``[B, T]`` as in transformers (the
        loss predicts ``labels[:, 1:]``, -100 ignored)."""
        targets = None
        if labels is not None:
            targets = torch.cat((labels[:, 1:], labels.new_full((labels.shape[0], 1), -100)),
                                dim=1)
        mask = None if attention_mask is None or bool(attention_mask.all()) else \
            attention_mask.bool()
        out = self.model(input_ids, targets=targets, key_padding_mask=mask, cache=cache,
                         use_cache=bool(use_cache))
        loss = None if out.loss is None else out.loss + out.aux_loss
        return CausalLMOutputWithPast(loss=loss, logits=out.logits, cache=out.cache)

    def prepare_inputs_for_generation(self, input_ids: Tensor, cache: ModelCache | None = None,
                                      attention_mask: Tensor | None = None,
                                      **kwargs: Any) -> dict[str, Any]:
        """The tokens the cache has not seen yet, with the cache (transformers' generate)."""
        if cache is not None:
            input_ids = input_ids[:, cache.next_position:]
        return {"input_ids": input_ids, "cache": cache, "attention_mask": attention_mask,
                "use_cache": True}


def from_decoder(model: DecoderLM) -> AttnlabForCausalLM:
    """A Hugging Face model holding ``model``'s weights (same dtype)."""
    config = AttnlabConfig(attnlab_model=to_dict(model.cfg), vocab_size=model.cfg.vocab_size,
                           tie_word_embeddings=model.cfg.tie_embeddings)
    hf = AttnlabForCausalLM(config).to(next(model.parameters()).dtype)
    hf.model.load_state_dict(model.state_dict())
    return hf.eval()


@contextlib.contextmanager
def weights_file_errors(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Around loading a model from ``folder``: safetensors' error for a truncated or corrupt
    weights file becomes a ``ValueError`` naming the file and how to get a good one."""
    try:
        yield
    except SafetensorError as err:
        files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
        broken = next((f for f in files if not _readable(f)), Path(folder))
        raise ValueError(
            f"{broken} is truncated or corrupt ({err}); copy or download the model again, or "
            "write it again (save_pretrained, attnlab export)") from err


def _readable(file: Path) -> bool:
    """Whether safetensors can open ``file`` (its header, which covers the whole file)."""
    try:
        with safe_open(file, framework="pt"):
            return True
    except SafetensorError:
        return False


def register() -> None:
    """Register the model with transformers' Auto classes (idempotent)."""
    AutoConfig.register(MODEL_TYPE, AttnlabConfig, exist_ok=True)
    AutoModel.register(AttnlabConfig, AttnlabForCausalLM, exist_ok=True)
    AutoModelForCausalLM.register(AttnlabConfig, AttnlabForCausalLM, exist_ok=True)
