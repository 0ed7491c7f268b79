"""The three exchangeable parts of an attention layer and the records they pass around.

An attention layer = *projections* (x -> q, k, v and o -> y) + *positions* (how token
order enters the scores) + *core* (q, k, v -> o). Each part is an ``nn.Module`` registered
by name (see :mod:`attnlab.layers.parts`), so any compatible combination is one config line.

Tensor layout inside the layer: ``[batch, heads, seq, head_dim]``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.layers.bias import ScoreBias

Aux = dict[str, Tensor]


def merge_aux(*parts: Aux) -> Aux:
    """Sum auxiliary-loss dicts key by key."""
    out: Aux = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out[key] + value if key in out else value
    return out


@dataclasses.dataclass
class Projected:
    """What a projections part produces for the current tokens.

    q: ``[B, H, T, D]``; k: ``[B, Hk, T, D]``; v: ``[B, Hk, T, Dv]`` (Hk divides H).
    ``state`` is private to the projections part and handed back to ``output``.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    state: Any = None
    aux: Aux = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class CoreOutput:
    """o: ``[B, H, Tq, Dv]``; ``state``: the core's own decoding state (None if stateless)."""

    out: Tensor
    aux: Aux = dataclasses.field(default_factory=dict)
    state: Any = None


@dataclasses.dataclass(frozen=True)
class LayerContext:
    """Shape facts every part is built from.

    Only ``d_model`` and ``n_heads`` are required: ``d_head`` defaults to
    ``d_model // n_heads`` (which must then divide), the layer is causal, position tables
    hold ``max_seq_len`` rows, and the layer is the first (``layer_idx=0``) of one layer
    with the standard initialisation scale.
    """

    d_model: int
    n_heads: int
    d_head: int | None = None
    causal: bool = True
    max_seq_len: int = 2048
    layer_idx: int = 0
    n_layers: int = 1
    init_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "max_seq_len", "n_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"LayerContext.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"LayerContext: d_model={self.d_model} is not divisible by "
                    f"n_heads={self.n_heads}; pass d_head explicitly"
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_head < 1:
            raise ValueError(f"LayerContext.d_head must be >= 1, got {self.d_head}")
        if not 0 <= self.layer_idx < self.n_layers:
            raise ValueError(
                f"LayerContext.layer_idx={self.layer_idx} is not in [0, n_layers={self.n_layers})"
            )
        if self.init_scale <= 0:
            raise ValueError(f"LayerContext.init_scale must be > 0, got {self.init_scale}")


def init_linear_(weight: Tensor, fan_in: int, scale: float) -> None:
    """N(0, (scale / sqrt(fan_in))^2) initialisation, in place."""
    with torch.no_grad():
        weight.normal_(0.0, scale / math.sqrt(fan_in))


class Projections(nn.Module):
    """Turns ``x [B, T, d_model]`` into q, k, v and the attention output back into the model.

    ``score_scale`` is the factor the core applies to ``q k^T``; ``qk_prescale`` is the
    factor already applied to q and k themselves (position keys must get it too).
    """

    score_scale: float
    qk_prescale: float = 1.0

    def project(self, x: Tensor) -> Projected:
        raise NotImplementedError

    def output(self, o: Tensor, projected: Projected) -> tuple[Tensor, Aux]:
        """``o [B, H, T, Dv]`` -> ``[B, T, d_model]`` and auxiliary losses."""
        raise NotImplementedError


class Positions(nn.Module):
    """How positions enter attention. Keys are position-free when cached; this part adds them.

    ``q_positions [Tq]`` and ``k_positions [Tk]`` (long) are the token positions of the
    queries and keys: the queries are the last ``Tq`` keys, and a cache that dropped keys (the
    ``window`` core's) leaves gaps in ``k_positions``.
    """

    def rotate(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        return q, k

    def score_bias(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, scale: float,
        qk_prescale: float,
    ) -> ScoreBias | None:
        """The additive score bias over the ``[B, H, Tq, Tk]`` pairs, with ``scale`` (the
        factor of ``q k^T``) folded in where the bias is a product with q; None for none.
        Schemes that return one are registered with the ``score_bias`` trait."""
        return None


class AttentionCore(nn.Module):
    """q ``[B, H, Tq, D]``, k ``[B, Hk, Tk, D]``, v ``[B, Hk, Tk, Dv]`` -> ``CoreOutput``.

    ``key_padding_mask`` is ``[B, Tk]`` bool with True = real key. ``score_bias`` (a
    :class:`~attnlab.layers.bias.ScoreBias`) reaches only cores registered with the
    ``score_bias`` trait; the registry refuses other combinations at config time. ``state``
    is this core's decoding state from the previous call (None on the first call).
    ``exact_restart``: whether a state rebuilt from cached keys alone (a cache filled
    elsewhere) equals the one decoding would have carried.
    """

    exact_restart = False

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
        raise NotImplementedError

    def cache_columns(self, key_padding_mask: Tensor | None, n_keys: int) -> Tensor | None:
        """Which of the ``n_keys`` keys (``[B, Tk]`` mask, True = real) a decoding cache must
        keep for later queries: ``[n]`` increasing column indices, or None for all of them."""
        return None

    def derived_options(self) -> dict[str, Any]:
        """Options this core derived from its context (e.g. from ``max_seq_len``) that shape
        its state: a rebuild at another length with these pinned loads this core's state
        dict (default: none)."""
        return {}
