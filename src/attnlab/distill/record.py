"""What distillation reads inside a model's attention layers.

:class:`LayerRecorder` hooks a model's attention cores (and, for attnlab models, its blocks)
and records, for the forwards run inside :meth:`LayerRecorder.recording`: each block's output
hidden state ``[B, T, d_model]``, each core's output (the context before the output
projection) ``[B, H, T, Dv]`` and, for a teacher, each layer's attention probabilities
``[B, H, Tq, Tk]`` (recomputed from the core's q, k with its scale, causality and key-padding
mask; O(T^2), training only). :func:`attention_targets` hands a teacher's probabilities to
the student's cores that learn from them (SEA's ``teacher_probs``) for one forward.

The cores are attnlab cores either way: ``block.attn.core`` of a
:class:`~attnlab.models.DecoderLM`, or the ``attnlab_core`` of each layer of a converted
Hugging Face model (:func:`attnlab.hf.cores`; a teacher is converted to the exact ``sdpa``
core, so its context and probabilities come out the same way).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from attnlab.layers.cores import DenseCore


def model_cores(model: nn.Module) -> list[nn.Module]:
    """The attention core of each block of an attnlab model, in layer order."""
    return [block.attn.core for block in model.blocks]


@dataclasses.dataclass
class Recorded:
    """What one :meth:`LayerRecorder.recording` block saw, per layer in call order."""

    hidden: list[Tensor] = dataclasses.field(default_factory=list)
    context: list[Tensor] = dataclasses.field(default_factory=list)
    probs: list[Tensor] = dataclasses.field(default_factory=list)


class LayerRecorder:
    """Records the contexts and (``probs=True``) attention of ``cores``, and the hidden state
    output by each of ``blocks`` (attnlab blocks, whose output is ``(hidden, ...)``), inside
    :meth:`recording` only: other forwards (evaluations) record nothing, and the recorder
    keeps no tensor once the block is left."""

    def __init__(self, cores: Sequence[nn.Module], *, blocks: Sequence[nn.Module] = (),
                 probs: bool) -> None:
        self._current: Recorded | None = None
        self._handles: list[RemovableHandle] = []
        for block in blocks:
            self._handles.append(block.register_forward_hook(self._on_block))
        for core in cores:
            self._handles.append(core.register_forward_hook(
                self._on_core_with_probs if probs else self._on_core, with_kwargs=True))

    @classmethod
    def of_model(cls, model: nn.Module, *, probs: bool) -> LayerRecorder:
        """A recorder of every block and core of an attnlab model."""
        return cls(model_cores(model), blocks=model.blocks, probs=probs)

    def _on_block(self, module, args, output) -> None:
        if self._current is not None:
            self._current.hidden.append(output[0])

    def _on_core(self, module, args, kwargs, output) -> None:
        if self._current is not None:
            self._current.context.append(output.out)

    def _on_core_with_probs(self, module, args, kwargs, output) -> None:
        if self._current is None:
            return
        self._on_core(module, args, kwargs, output)
        if not isinstance(module, DenseCore):
            raise ValueError(f"a teacher's attention weights come from a dense core (sdpa or "
                             f"eager); this teacher has {type(module).__name__}")
        q, k, v = args
        weights = module.attention_weights(
            q, k, v, scale=kwargs["scale"], key_padding_mask=kwargs.get("key_padding_mask"),
            score_bias=kwargs.get("score_bias"))
        self._current.probs.append(weights.detach())

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recorded]:
        """Record the forwards run inside the block into the :class:`Recorded` yielded."""
        self._current = Recorded()
        try:
            yield self._current
        finally:
            self._current = None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@contextlib.contextmanager
def attention_targets(cores: Sequence[nn.Module], probs: Sequence[Tensor]) -> Iterator[None]:
    """Give ``cores[i]`` ``probs[i]`` as its ``teacher_probs`` (cores that learn attention) for the
    duration of the block."""
    if len(cores) != len(probs):
        raise ValueError(f"{len(probs)} teacher layers for a student of {len(cores)} layers")
    learners = [(core, p) for core, p in zip(cores, probs, strict=True)
                if core.traits["learns_attention"]]
    for core, p in learners:
        core.teacher_probs = p
    try:
        yield
    finally:
        for core, _ in learners:
            core.teacher_probs = None
