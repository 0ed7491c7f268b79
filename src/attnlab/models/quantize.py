"""Weight-only int8 quantization of a model's linear layers, for inference.

:func:`quantize_linears` swaps every ``nn.Linear`` of a model (attnlab's or a Hugging Face
one, original or converted) for an :class:`Int8Linear` holding the weight as int8 with one
scale per output channel (:func:`attnlab.ops.quantized.quantize_int8`). Activations keep the
model's dtype. A decode step of a small model reads mostly weights, so it reads about half the
bytes of bfloat16 (a quarter of float32's). A weight tied to another (an output head tied to
the embedding) is quantized as a copy; the embedding stays as it was.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnlab.ops.quantized import int8_linear, quantize_int8


class Int8Linear(nn.Module):
    """``x [..., in_features] -> [..., out_features]`` through an int8 weight ``q [out, in]``,
    a per-row ``scale [out]`` and an optional ``bias [out]`` (buffers: inference only)."""

    def __init__(self, q: Tensor, scale: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        if q.dtype != torch.int8 or q.dim() != 2 or scale.shape != q.shape[:1]:
            raise ValueError(f"need an int8 [out, in] weight and a [out] scale, got "
                             f"{q.dtype} {tuple(q.shape)} and {tuple(scale.shape)}")
        self.out_features, self.in_features = q.shape
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """The int8 form of ``linear``: its weight quantized, its bias kept."""
        q, scale = quantize_int8(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale, bias)

    def forward(self, x: Tensor) -> Tensor:
        return int8_linear(x, self.q, self.scale, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weights=int8")


def quantize_linears(model: nn.Module, *,
                     keep: Callable[[str, nn.Linear], bool] = lambda name, linear: False
                     ) -> int:
    """Replace, in place, every ``nn.Linear`` of ``model`` by its :class:`Int8Linear` unless
    ``keep(qualified_name, linear)``; returns how many were replaced. The model is for
    inference from then on (its linear weights hold no gradient)."""
    if isinstance(model, nn.Linear):
        raise ValueError("quantize_linears replaces the linear layers inside a model; for a "
                         "bare nn.Linear use Int8Linear.from_linear")
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and not keep(name, module)]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Int8Linear.from_linear(linear))
    return len(targets)
