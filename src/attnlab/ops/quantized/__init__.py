"""Linear maps with quantized weights (weight-only: activations stay floating)."""

from attnlab.ops.quantized.int8_linear import int8_linear, int8_linear_naive, quantize_int8

__all__ = ["int8_linear", "int8_linear_naive", "quantize_int8"]
