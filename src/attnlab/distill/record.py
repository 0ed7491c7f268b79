"""What distillation reads inside an attnlab :class:`~attnlab.models.DecoderLM`.

:class:`LayerRecorder` hooks every block and attention core of a model and records, per
forward: each block's output hidden state ``[B, T, d_model]``, each core's output (the
context before the output projection) ``[B, H, T, Dv]`` and, for a teacher, each layer's
attention probabilities ``[B, H, T, Tk]`` (recomputed from the core's q, k with its scale and
masks; O(T^2), training only). :func:`attention_targets` hands a teacher's probabilities to
the student's cores that learn from them (SEA's ``teacher_probs``) for one forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from attnlab.ops.attention import softmax_attention


class LayerRecorder:
    """Records hidden states, contexts and (``probs=True``) attention of ``model.blocks``."""

    def __init__(self, model: nn.Module, *, probs: bool) -> None:
        self.hidden: list[Tensor] = []
        self.context: list[Tensor] = []
        self.probs: list[Tensor] = []
        self._handles: list[RemovableHandle] = []
        for block in model.blocks:
            self._handles.append(block.register_forward_hook(self._on_block))
            self._handles.append(block.attn.core.register_forward_hook(
                self._on_core_with_probs if probs else self._on_core, with_kwargs=True))

    def _on_block(self, module, args, output) -> None:
        self.hidden.append(output[0])

    def _on_core(self, module, args, kwargs, output) -> None:
        self.context.append(output.out)

    def _on_core_with_probs(self, module, args, kwargs, output) -> None:
        self._on_core(module, args, kwargs, output)
        q, k, v = args
        _, weights = softmax_attention(
            q, k, v, scale=kwargs["scale"], causal=True,
            key_padding_mask=kwargs.get("key_padding_mask"), score_bias=kwargs.get("score_bias"),
            return_weights=True,
        )
        self.probs.append(weights.detach())

    def clear(self) -> None:
        self.hidden, self.context, self.probs = [], [], []

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@contextlib.contextmanager
def attention_targets(model: nn.Module, probs: Sequence[Tensor]) -> Iterator[None]:
    """Give layer i's core ``probs[i]`` as its ``teacher_probs`` (cores that have one) for the
    duration of the block."""
    cores = [block.attn.core for block in model.blocks]
    if len(cores) != len(probs):
        raise ValueError(f"{len(probs)} teacher layers for a student of {len(cores)} layers")
    learners = [(core, p) for core, p in zip(cores, probs, strict=True)
                if hasattr(core, "teacher_probs")]
    for core, p in learners:
        core.teacher_probs = p
    try:
        yield
    finally:
        for core, _ in learners:
            core.teacher_probs = None
