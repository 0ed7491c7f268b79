"""What a part costs, declared by the part: the ``cost`` trait of projections, positions and
cores and the ``macs_per_token`` trait of MLPs, read by :mod:`attnlab.metrics.macs`.

A ``cost`` is a function ``(shape: LayerShape, options) -> (MACs, floats)``: the matmul
multiply-accumulates the part executes in one layer's forward on ``shape.t`` new tokens over
``shape.tk`` keys, and the floats of the main tensors it materialises (element-wise work such
as RoPE, softmax, gates and masks is not counted). ``options`` is the part's options
dataclass. An MLP's ``macs_per_token(d_model, d_ff, options) -> int`` is its forward MACs for
one token. A part that declares none is refused by ``attnlab macs`` with a message saying so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """The sizes of one attention layer's forward: ``t`` new tokens over ``tk`` keys
    (``tk = t + memory_len``), ``h`` query heads of ``dh`` channels, model width ``d``."""

    d: int
    h: int
    dh: int
    t: int
    tk: int
    causal: bool = True


Cost = tuple[int, int]
CostFn = Callable[[LayerShape, Any], Cost]


def no_cost(shape: LayerShape, options: Any) -> Cost:
    """A part with no matmuls and no tensor of its own (e.g. RoPE, no positions)."""
    return 0, 0


def bias_table_cost(shape: LayerShape, options: Any) -> Cost:
    """A dense ``[H, T, Tk]`` score bias computed element-wise (e.g. ALiBi): no MACs."""
    return 0, shape.h * shape.t * shape.tk


def dense_scores_cost(shape: LayerShape, options: Any) -> Cost:
    """``q k^T`` and ``attn v`` over the full ``T x Tk`` rectangle (scores and
    probabilities materialised), as dense SDPA and the eager core compute them: no causal
    halving."""
    return 2 * shape.h * shape.t * shape.tk * shape.dh, 2 * shape.h * shape.t * shape.tk
