"""The ``flex`` core: exact attention through ``torch.nn.attention.flex_attention``.

The positions' :class:`~attnlab.layers.bias.ScoreBias` becomes the kernel's ``score_mod`` and
the causal and padding masks its block mask, so a bias (ALiBi, Transformer-XL relative
positions, your own) runs fused, block by block, without a ``[Tq, Tk]`` tensor; fully masked
blocks are skipped. ``softmax1`` is softmax over one extra key whose score and value are 0.

Compilation: the kernel is compiled (``torch.compile``, once per shape; a new bias closure
over new tensors reuses the compiled kernel; :func:`~attnlab.ops.sparse_attention.flex.
flex_attend`, shared with the sparse executors). With torch 2.13 the compiled CPU kernel is
inference-only, so on CPU a call that needs gradients runs the explicit reference with the
bias made dense instead (same result; a one-time log line says so). Decoding calls (fewer
than :data:`~attnlab.ops.sparse_attention.executors.COMPILE_MIN_QUERIES` queries) skip
compilation too, since every step has a new key count.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import torch
from torch import Tensor

from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.registry import CORES
from attnlab.ops.attention import softmax_attention
from attnlab.ops.sparse_attention.executors import COMPILE_MIN_QUERIES
from attnlab.ops.sparse_attention.flex import flex_attend, flex_serves

logger = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True)
class FlexOptions:
    activation: str = "softmax"  # softmax or softmax1 (sigmoid has no flex form)
    compile: bool = True  # False: the reference path always (for debugging)

    def validate(self) -> None:
        if self.activation not in ("softmax", "softmax1"):
            raise ValueError(f"the flex core computes activation 'softmax' or 'softmax1', not "
                             f"{self.activation!r}; 'sigmoid' needs core 'sdpa' or 'eager'")


@functools.cache
def _say_cpu_training_runs_the_reference() -> None:
    logger.info("flex core: compiled FlexAttention on CPU is inference-only; training steps "
                "run the explicit reference (same result)")


class FlexCore(AttentionCore):
    """``activation(scale * q k^T + bias) v`` with the bias and masks inside FlexAttention."""

    def __init__(self, ctx: LayerContext, options: FlexOptions) -> None:
        super().__init__()
        self.causal = ctx.causal
        self.activation = options.activation
        self.compile = options.compile

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, compile={self.compile}"

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_padding_mask: Tensor | None = None,
        score_bias: ScoreBias | None = None,
        state: Any = None,
    ) -> CoreOutput:
        """q ``[B, H, Tq, D]`` (the last ``Tq`` of the keys), k, v ``[B, Hk, Tk, D]`` ->
        ``[B, H, Tq, Dv]``; ``key_padding_mask`` ``[B, Tk]``, True = real key."""
        if not self._fused(q, k, v):
            return CoreOutput(softmax_attention(
                q, k, v, scale=scale, causal=self.causal, key_padding_mask=key_padding_mask,
                score_bias=None if score_bias is None else score_bias.dense(),
                activation=self.activation))
        null = int(self.activation == "softmax1")  # softmax1: one extra key at index 0
        if null:
            k = torch.cat((k.new_zeros(*k.shape[:2], 1, k.shape[-1]), k), dim=-2)
            v = torch.cat((v.new_zeros(*v.shape[:2], 1, v.shape[-1]), v), dim=-2)
        block_mask = self._block_mask(q, k.shape[-2], key_padding_mask, null)
        score_mod = None if score_bias is None else _shifted(score_bias, null)
        out = flex_attend(q, k, v, block_mask, scale=scale, score_mod=score_mod)
        return CoreOutput(out)

    def _fused(self, *tensors: Tensor) -> bool:
        """Whether this call runs the compiled kernel (module docstring)."""
        cpu_training = not flex_serves(*tensors)
        if cpu_training and self.compile:
            _say_cpu_training_runs_the_reference()
        return self.compile and not cpu_training and tensors[0].shape[-2] >= COMPILE_MIN_QUERIES

    def _block_mask(self, q: Tensor, n_keys: int, key_padding_mask: Tensor | None,
                    null: int) -> Any:
        """The causal (bottom-right aligned) and padding mask as a FlexAttention block mask;
        key ``null - 1`` and before (the softmax1 null key) is always visible."""
        from torch.nn.attention.flex_attention import create_block_mask

        t_q = q.shape[-2]
        offset = n_keys - t_q  # query i sits at key position offset + i
        causal, pad, last = self.causal, key_padding_mask, n_keys - null - 1

        def mask_mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            visible = j >= 0
            if causal:
                visible = visible & (j <= i + offset)
            if pad is not None:
                visible = visible & pad[b, (j - null).clamp(0, last)]
            return visible | (j < null)

        if not causal and pad is None and not null:
            return None
        batch = None if pad is None else q.shape[0]
        return create_block_mask(mask_mod, batch, None, t_q, n_keys, device=q.device)


def _shifted(bias: ScoreBias, null: int) -> Any:
    """``bias.score_mod`` for keys shifted right by ``null`` (the null key's bias is 0)."""
    if not null:
        return bias.score_mod()
    fn = bias.fn

    def score_mod(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return torch.where(j < null, score, score + fn(b, h, i, (j - null).clamp_min(0)))

    return score_mod


@CORES.register("flex", FlexOptions, score_bias=True)
def _flex(ctx: LayerContext, options: FlexOptions, dropout: float) -> FlexCore:
    """FlexAttention: exact attention with the position bias and masks fused in one kernel."""
    return FlexCore(ctx, options)
