"""The composable attention layer: projections + positions + core, with a KV cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config import ConfigError, PartSpec
from attnlab.layers.base import Aux, LayerContext, merge_aux
from attnlab.layers.registry import CORES, POSITIONS, PROJECTIONS


@dataclasses.dataclass
class AttentionConfig:
    """Which parts make the attention layer, and their shared sizes.

    ``projections``, ``positions`` and ``core`` are registry names, or mappings
    ``{name: ..., option: value}`` with the part's own options.
    """

    n_heads: int = 4
    d_head: int | None = None  # None = d_model // n_heads
    projections: PartSpec = PartSpec("dense")
    positions: PartSpec = PartSpec("rope")
    core: PartSpec = PartSpec("sdpa")
    dropout: float = 0.0  # on attention probabilities (cores that have them)

    def __post_init__(self) -> None:
        for part in ("projections", "positions", "core"):
            setattr(self, part, PartSpec.parse(getattr(self, part), f"attention.{part}"))
        self.validate()

    def validate(self) -> None:
        if self.n_heads < 1:
            raise ValueError(f"n_heads must be >= 1, got {self.n_heads}")
        if self.d_head is not None and self.d_head < 1:
            raise ValueError(f"d_head must be >= 1, got {self.d_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        PROJECTIONS.options(self.projections)
        POSITIONS.options(self.positions)
        CORES.options(self.core)
        if POSITIONS.trait(self.positions.name, "score_bias") and not CORES.trait(
            self.core.name, "score_bias"
        ):
            raise ConfigError(
                f"positions '{self.positions.name}' adds a score bias, which core "
                f"'{self.core.name}' cannot take; cores that can: {CORES.names(score_bias=True)}"
            )


@dataclasses.dataclass
class LayerCache:
    """Keys and values of past tokens for one layer (a KV cache, or Transformer-XL memory).

    k: ``[B, Hk, Tc, D]`` *before* positions are applied; v: ``[B, Hk, Tc, Dv]``;
    key_mask: ``[B, Tc]`` bool (True = real token) or None when all are real;
    core_state: the core's own decoding state.
    """

    k: Tensor
    v: Tensor
    key_mask: Tensor | None = None
    core_state: Any = None

    @property
    def length(self) -> int:
        return self.k.shape[-2]

    def trimmed(self, max_len: int, detach: bool = True) -> LayerCache:
        """The last ``max_len`` positions (stateful cores must support trimming themselves)."""
        k, v = self.k[..., -max_len:, :], self.v[..., -max_len:, :]
        mask = None if self.key_mask is None else self.key_mask[:, -max_len:]
        if detach:
            k, v = k.detach(), v.detach()
        return LayerCache(k, v, mask, self.core_state)


@dataclasses.dataclass
class AttentionOutput:
    hidden: Tensor  # [B, T, d_model]
    aux: Aux
    cache: LayerCache | None


class Attention(nn.Module):
    """Self-attention built from registered parts.

    ``forward(x [B, T, d_model], key_padding_mask=None, cache=None, use_cache=False)``:

    - ``key_padding_mask``: bool, True = real token, False = padding. Either ``[B, T]`` for
      the current tokens (the cache keeps its own mask) or ``[B, Tc + T]`` covering cached
      and current tokens.
    - ``cache``: :class:`LayerCache` of earlier tokens; the current tokens follow them.
    - Returns :class:`AttentionOutput` with the new cache when ``use_cache``.
    """

    def __init__(self, ctx: LayerContext, cfg: AttentionConfig) -> None:
        super().__init__()
        self.ctx = ctx
        self.projections = PROJECTIONS.build(cfg.projections, ctx=ctx)
        self.positions = POSITIONS.build(cfg.positions, ctx=ctx)
        self.core = CORES.build(cfg.core, ctx=ctx, dropout=cfg.dropout)

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 3 or x.shape[-1] != self.ctx.d_model:
            raise ValueError(
                f"attention input must be [batch, seq, d_model={self.ctx.d_model}], "
                f"got {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"attention input must be a floating-point tensor, got {x.dtype}")

    @staticmethod
    def _key_mask(
        mask: Tensor | None, cache: LayerCache | None, batch: int, t_new: int
    ) -> Tensor | None:
        t_cached = cache.length if cache is not None else 0
        cached = cache.key_mask if cache is not None else None
        if mask is None:
            if cached is None:
                return None
            mask = torch.ones(batch, t_new, dtype=torch.bool, device=cached.device)
        if mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask must be bool (True = real token), got {mask.dtype}")
        lengths = (t_new, t_cached + t_new)
        if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] not in lengths:
            raise ValueError(
                f"key_padding_mask must be [batch={batch}, {t_new}] or "
                f"[batch={batch}, {t_cached + t_new}] (cached + current), got {tuple(mask.shape)}"
            )
        if mask.shape[1] == t_cached + t_new:
            return mask
        if t_cached == 0:
            return mask
        if cached is None:
            cached = torch.ones(batch, t_cached, dtype=torch.bool, device=mask.device)
        return torch.cat((cached, mask), dim=1)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        use_cache: bool = False,
    ) -> AttentionOutput:
        self._check_input(x)
        projected = self.projections.project(x)
        k, v = projected.k, projected.v
        if cache is not None:
            k, v = torch.cat((cache.k, k), dim=-2), torch.cat((cache.v, v), dim=-2)
        mask = self._key_mask(key_padding_mask, cache, x.shape[0], x.shape[1])
        q_offset = k.shape[-2] - x.shape[1]
        q_pos, k_pos = self.positions.rotate(projected.q, k, q_offset)
        scale = self.projections.score_scale
        bias = self.positions.score_bias(
            q_pos, k_pos, q_offset, scale, self.projections.qk_prescale
        )
        core_out = self.core(
            q_pos, k_pos, v, scale=scale, key_padding_mask=mask, score_bias=bias,
            state=cache.core_state if cache is not None else None,
        )
        hidden, out_aux = self.projections.output(core_out.out, projected)
        new_cache = LayerCache(k, v, mask, core_out.state) if use_cache else None
        return AttentionOutput(hidden, merge_aux(projected.aux, core_out.aux, out_aux), new_cache)
