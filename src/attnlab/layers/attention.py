"""The composable attention layer: projections + positions + core, with a KV cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config import ConfigError, PartSpec
from attnlab.layers.base import Aux, LayerContext, Projected, merge_aux
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
                f"; position schemes core '{self.core.name}' can take: "
                f"{POSITIONS.names(score_bias=False)}"
            )
        if self.dropout and not CORES.trait(self.core.name, "dropout"):
            raise ConfigError(
                f"core '{self.core.name}' applies no attention dropout (dropout="
                f"{self.dropout}); set attention.dropout to 0, or use a core that can: "
                f"{CORES.names(dropout=True)}"
            )


@dataclasses.dataclass
class LayerCache:
    """Keys and values of past tokens for one layer (a KV cache, or Transformer-XL memory).

    k: ``[B, Hk, Tc, D]`` *before* positions are applied; v: ``[B, Hk, Tc, Dv]``;
    key_mask: ``[B, Tc]`` bool (True = real token) or None when all are real;
    core_state: the core's own decoding state;
    positions: ``[Tc]`` long, each cached token's position, or None for ``0..Tc-1``. A core
    that never attends to some past keys again (``window``) drops them, leaving gaps;
    layer_idx: the layer that made the cache (None: unknown), checked when it is used.
    """

    k: Tensor
    v: Tensor
    key_mask: Tensor | None = None
    core_state: Any = None
    positions: Tensor | None = None
    layer_idx: int | None = None

    @property
    def length(self) -> int:
        """Cached tokens (what the cache holds)."""
        return self.k.shape[-2]

    @property
    def next_position(self) -> int:
        """Position of the token that follows the cached ones (tokens seen so far)."""
        return self.length if self.positions is None else int(self.positions[-1]) + 1

    def key_positions(self) -> Tensor:
        """``[Tc]`` position of each cached token."""
        if self.positions is not None:
            return self.positions
        return torch.arange(self.length, device=self.k.device)

    def selected(self, columns: Tensor) -> LayerCache:
        """Only the cached tokens at ``columns`` (``[n]`` long, increasing), positions kept."""
        mask = None if self.key_mask is None else self.key_mask[:, columns]
        return dataclasses.replace(self, k=self.k[..., columns, :], v=self.v[..., columns, :],
                                   key_mask=mask, positions=self.key_positions()[columns])

    def trimmed(self, max_len: int, detach: bool = True) -> LayerCache:
        """The last ``max_len`` tokens, renumbered from 0 (Transformer-XL memory; stateful
        cores must support trimming themselves)."""
        k, v = self.k[..., -max_len:, :], self.v[..., -max_len:, :]
        mask = None if self.key_mask is None else self.key_mask[:, -max_len:]
        positions = None
        if self.positions is not None:
            positions = self.positions[-max_len:] - self.positions[-max_len:][0]
        if detach:
            k, v = k.detach(), v.detach()
        return dataclasses.replace(self, k=k, v=v, key_mask=mask, positions=positions)


@dataclasses.dataclass
class AttentionOutput:
    hidden: Tensor  # [B, T, d_model]
    aux: Aux
    cache: LayerCache | None


class Attention(nn.Module):
    """Self-attention built from registered parts.

    ``forward(x [B, T, d_model], key_padding_mask=None, cache=None, use_cache=False)``:

    - ``key_padding_mask``: bool, True = real token, False = padding. Either ``[B, T]`` for
      the current tokens (the cache keeps its own mask) or ``[B, Tc + T]`` covering every
      token seen (``Tc = cache.next_position``, which counts the keys a ``window`` core's cache
      dropped) and the current ones.
    - ``cache``: :class:`LayerCache` of earlier tokens; the current tokens follow them.
    - Returns :class:`AttentionOutput` with the new cache when ``use_cache``.
    """

    def __init__(self, ctx: LayerContext, cfg: AttentionConfig) -> None:
        super().__init__()
        if cfg.n_heads != ctx.n_heads or cfg.d_head not in (None, ctx.d_head):
            raise ValueError(
                f"AttentionConfig(n_heads={cfg.n_heads}, d_head={cfg.d_head}) disagrees with "
                f"LayerContext(n_heads={ctx.n_heads}, d_head={ctx.d_head}); build the context "
                "from the config's sizes"
            )
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
        weight = next(self.projections.parameters(), None)
        if (weight is not None and x.dtype != weight.dtype
                and not torch.is_autocast_enabled(x.device.type)):
            raise TypeError(
                f"attention input is {x.dtype} but the layer's weights are {weight.dtype}; "
                f"convert one of them (x.to({weight.dtype}) or layer.to({x.dtype})), or run "
                "under torch.autocast"
            )

    def _check_cache(self, cache: LayerCache, projected: Projected) -> None:
        """A cache must come from this layer, for the same batch, heads, sizes and device."""
        if cache.layer_idx is not None and cache.layer_idx != self.ctx.layer_idx:
            raise ValueError(
                f"the cache was made by layer {cache.layer_idx}, not by this layer "
                f"({self.ctx.layer_idx}); pass each layer its own cache"
            )
        for name, new in (("k", projected.k), ("v", projected.v)):
            old = getattr(cache, name)
            if old.dim() != 4 or old.shape[:2] != new.shape[:2] or old.shape[3] != new.shape[3]:
                raise ValueError(
                    f"cache.{name} is {tuple(old.shape)}, but this layer and batch need "
                    f"[{new.shape[0]}, {new.shape[1]}, cached tokens, {new.shape[3]}]"
                )
            if old.device != new.device or old.dtype != new.dtype:
                raise TypeError(
                    f"cache.{name} is {old.dtype} on {old.device}, but this layer computes "
                    f"{new.dtype} on {new.device}"
                )

    @staticmethod
    def _key_mask(
        mask: Tensor | None, cache: LayerCache | None, batch: int, k_positions: Tensor
    ) -> Tensor | None:
        """The ``[B, Tk]`` mask of the cached and current keys (``k_positions`` ``[Tk]``)."""
        t_new = k_positions.shape[0] - (cache.length if cache is not None else 0)
        seen = cache.next_position if cache is not None else 0
        cached = cache.key_mask if cache is not None else None
        if mask is None:
            if cached is None:
                return None
            mask = torch.ones(batch, t_new, dtype=torch.bool, device=cached.device)
        if mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask must be bool (True = real token), got {mask.dtype}")
        if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] not in (t_new, seen + t_new):
            raise ValueError(
                f"key_padding_mask must be [batch={batch}, {t_new}] or "
                f"[batch={batch}, {seen + t_new}] (cached + current), got {tuple(mask.shape)}"
            )
        if mask.shape[1] == seen + t_new:
            return mask if seen + t_new == k_positions.shape[0] else mask[:, k_positions]
        if seen == 0:
            return mask
        if cached is None:
            cached = torch.ones(batch, cache.length, dtype=torch.bool, device=mask.device)
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
        t_new = x.shape[1]
        new_positions = torch.arange(t_new, device=x.device)
        k_positions = new_positions
        if cache is not None:
            self._check_cache(cache, projected)
            k, v = torch.cat((cache.k, k), dim=-2), torch.cat((cache.v, v), dim=-2)
            new_positions = new_positions + cache.next_position
            k_positions = torch.cat((cache.key_positions().to(x.device), new_positions))
        mask = self._key_mask(key_padding_mask, cache, x.shape[0], k_positions)
        q_pos, k_pos = self.positions.rotate(projected.q, k, new_positions, k_positions)
        scale = self.projections.score_scale
        bias = self.positions.score_bias(
            q_pos, k_pos, new_positions, k_positions, scale, self.projections.qk_prescale
        )
        core_out = self.core(
            q_pos, k_pos, v, scale=scale, key_padding_mask=mask, score_bias=bias,
            state=cache.core_state if cache is not None else None,
        )
        hidden, out_aux = self.projections.output(core_out.out, projected)
        new_cache = None
        if use_cache:
            gaps = cache is not None and cache.positions is not None
            new_cache = LayerCache(k, v, mask, core_out.state, k_positions if gaps else None,
                                   self.ctx.layer_idx)
            kept = self.core.cache_columns(mask, k.shape[-2])
            if kept is not None:
                new_cache = new_cache.selected(kept)
        return AttentionOutput(hidden, merge_aux(projected.aux, core_out.aux, out_aux), new_cache)
