"""Positional schemes: none, learned absolute, rotary (RoPE), Transformer-XL relative, ALiBi."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from attnlab.layers.base import LayerContext, Positions, init_linear_
from attnlab.layers.bias import ScoreBias
from attnlab.layers.cost import Cost, LayerShape, bias_table_cost, no_cost
from attnlab.layers.registry import POSITIONS, NoOptions
from attnlab.ops.attention.bias import DistanceBias


class NoPositions(Positions):
    """No positional information inside attention (causal masking alone orders tokens)."""


class LearnedAbsolutePositions(Positions):
    """A learned table added to the token embeddings once, at the model input (GPT-2 style).

    Registered with the ``input_embedding`` trait: the model owns the table.
    """


@POSITIONS.register("none", NoOptions, cost=no_cost)
def _none(ctx: LayerContext, options: NoOptions) -> Positions:
    """No positional encoding."""
    return NoPositions()


@POSITIONS.register("learned", NoOptions, input_embedding=True, cost=no_cost)
def _learned(ctx: LayerContext, options: NoOptions) -> Positions:
    """Learned absolute position embeddings added at the input."""
    return LearnedAbsolutePositions()


@dataclasses.dataclass(frozen=True)
class RopeOptions:
    base: float = 10000.0
    fraction: float = 1.0  # share of each head's channels that are rotated (SwitchHead: 0.5)
    # position interpolation: positions are divided by this, so a model trained on T tokens
    # reads interpolation * T tokens within the angles it was trained on (Chen et al., 2023)
    interpolation: float = 1.0

    def validate(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.base <= 1.0:
            raise ValueError(f"base must be > 1, got {self.base}")
        if self.interpolation < 1.0:
            raise ValueError(f"interpolation must be >= 1, got {self.interpolation}")


def rotate_half_split(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotate the first ``2 * len(inv_freq)`` channels of ``x [..., T, D]`` (NeoX layout);
    angles in float32, or float64 for float64 ``x``."""
    n_rot = 2 * inv_freq.numel()
    wide = torch.promote_types(x.dtype, torch.float32)
    angles = positions[:, None].to(wide) * inv_freq[None, :].to(wide)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x_rot, x_pass = x[..., :n_rot], x[..., n_rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((rotated, x_pass), dim=-1)


class RotaryPositions(Positions):
    """RoPE: each query and key rotated by its own position (relative by construction)."""

    def __init__(self, d_head: int, options: RopeOptions) -> None:
        super().__init__()
        self.n_pairs = int(d_head * options.fraction) // 2
        if self.n_pairs < 1:
            raise ValueError(
                f"rope fraction {options.fraction} rotates no channel of d_head={d_head}"
            )
        self.options = options
        self.register_buffer("inv_freq", torch.empty(self.n_pairs), persistent=False)
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """(Re)compute the derived, unsaved ``inv_freq`` (also after a meta-device build)."""
        o, n = self.options, self.n_pairs
        inv_freq = o.base ** (-torch.arange(n, dtype=torch.float32) / n) / o.interpolation
        self.inv_freq = inv_freq.to(self.inv_freq.device, self.inv_freq.dtype)

    def rotate(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        inv_freq = self.inv_freq
        return (rotate_half_split(q, q_positions, inv_freq),
                rotate_half_split(k, k_positions, inv_freq))


@POSITIONS.register("rope", RopeOptions, cost=no_cost)
def _rope(ctx: LayerContext, options: RopeOptions) -> Positions:
    """Rotary position embeddings on q and k."""
    return RotaryPositions(ctx.d_head, options)


@dataclasses.dataclass(frozen=True)
class XLOptions:
    content_bias: bool = True  # global u/v biases of Transformer-XL (SwitchHead uses none)


def sinusoid(distances: Tensor, dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Transformer-XL sinusoidal embedding ``[n, dim]`` of integer distances ``[n]``, computed
    in ``dtype``."""
    channels = torch.arange(0, dim, 2, dtype=dtype, device=distances.device)
    inv_freq = 10000.0 ** (-channels / dim)
    angles = distances.to(dtype)[:, None] * inv_freq[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)[:, :dim]


class XLRelativePositions(Positions):
    """Transformer-XL relative positions: score += (q + v_h) . R(i - j) [+ u_h . k_j].

    R is a learned projection (d_model -> H*d_head) of sinusoidal distance embeddings. Each
    (query, key) pair gathers its distance's term, so it works with any cache or memory
    offset and for bidirectional attention (negative distances).
    """

    def __init__(self, ctx: LayerContext, options: XLOptions) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.d_head = ctx.d_model, ctx.n_heads, ctx.d_head
        self.causal = ctx.causal
        self.pos_proj = nn.Linear(ctx.d_model, ctx.n_heads * ctx.d_head, bias=False)
        init_linear_(self.pos_proj.weight, ctx.d_model, ctx.init_scale)
        if options.content_bias:
            self.u_bias = nn.Parameter(torch.zeros(ctx.n_heads, ctx.d_head))
            self.v_bias = nn.Parameter(torch.zeros(ctx.n_heads, ctx.d_head))
        else:
            self.u_bias = self.v_bias = None

    def score_bias(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, scale: float,
        qk_prescale: float,
    ) -> ScoreBias:
        b, h, t_q, _ = q.shape
        rel = q_positions[:, None] - k_positions[None, :]  # [Tq, Tk]
        lo = 0 if self.causal else int(rel.min())  # smallest distance a visible pair can have
        distances = torch.arange(lo, max(int(rel.max()), 0) + 1, device=q.device)
        wide = torch.promote_types(q.dtype, torch.float32)
        r = self.pos_proj(sinusoid(distances, self.d_model, wide).to(q.dtype)) * qk_prescale
        r = r.view(-1, self.n_heads, self.d_head).transpose(0, 1)  # [H, n_dist, D]
        q_r = q if self.v_bias is None else q + self.v_bias[None, :, None, :]
        by_distance = torch.einsum("bhid,hnd->bhin", q_r, r) * scale  # [B, H, Tq, n_dist]
        last = distances.numel() - 1
        content = None
        if self.u_bias is not None:
            kk = k.repeat_interleave(self.n_heads // k.shape[1], dim=1)
            content = torch.einsum("hd,bhjd->bhj", self.u_bias, kk) * scale  # [B, H, Tk]

        def bias(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            distance = (q_positions[i] - k_positions[j] - lo).clamp(0, last)  # masked may clamp
            out = by_distance[b, h, i, distance]
            return out if content is None else out + content[b, h, j]

        return ScoreBias(bias, b, h, t_q, k.shape[-2], q.device)


def xl_cost(s: LayerShape, options: XLOptions) -> Cost:
    """MACs and floats of ``XLRelativePositions.score_bias``: the projection of the distances
    ``0 .. Tk - 1`` (``-(T - 1) .. Tk - 1`` if not causal), the ``q . r`` table, the ``u . k``
    term with ``content_bias``, and the gathered ``[H, T, Tk]`` bias."""
    n_dist = s.tk if s.causal else s.tk + s.t - 1
    macs = n_dist * s.d * s.h * s.dh + s.h * s.t * n_dist * s.dh
    if options.content_bias:
        macs += s.h * s.tk * s.dh
    return macs, n_dist * s.h * s.dh + s.h * s.t * n_dist + s.h * s.t * s.tk


@POSITIONS.register("xl", XLOptions, score_bias=True, cost=xl_cost)
def _xl(ctx: LayerContext, options: XLOptions) -> Positions:
    """Transformer-XL relative positional scores (for use with a memory of past chunks)."""
    return XLRelativePositions(ctx, options)



@dataclasses.dataclass(frozen=True)
class AlibiOptions:
    exponent: float = 8.0  # head h of n gets slope 2^(-exponent * h / n), h = 1..n

    def validate(self) -> None:
        if self.exponent <= 0:
            raise ValueError(f"exponent must be > 0, got {self.exponent}")


def alibi_slopes(n_heads: int, exponent: float = 8.0) -> Tensor:
    """``[n_heads]`` ALiBi slopes (Press et al., 2022): the geometric sequence
    ``2^(-exponent * h / n)``, h = 1..n, for a power of two ``n``; otherwise those of the
    largest power of two below ``n_heads``, then every other slope of twice that many."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-exponent * h / n) for h in range(1, n + 1)]

    below = 2 ** (n_heads.bit_length() - 1)
    slopes = geometric(below) + geometric(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes, dtype=torch.float64)


class AlibiPositions(Positions):
    """ALiBi: score -= slope_h * distance, for each head's slope and the query-key distance
    in token positions (``|distance|`` when bidirectional). Nothing is learned; q and k stay
    as they are, so it combines with any projections. Positions are absolute token positions,
    so cached decoding and Transformer-XL memory see the true distances."""

    def __init__(self, ctx: LayerContext, options: AlibiOptions) -> None:
        super().__init__()
        self.causal = ctx.causal
        self.n_heads, self.exponent = ctx.n_heads, options.exponent
        self.register_buffer("slopes", torch.empty(ctx.n_heads), persistent=False)
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """(Re)compute the derived, unsaved ``slopes`` (also after a meta-device build)."""
        slopes = alibi_slopes(self.n_heads, self.exponent)
        self.slopes = slopes.to(self.slopes.device, self.slopes.dtype)

    def score_bias(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor, scale: float,
        qk_prescale: float,
    ) -> ScoreBias:
        bias = DistanceBias(self.slopes.to(q.dtype), q_positions, k_positions,
                            symmetric=not self.causal)
        return ScoreBias(bias, 1, q.shape[1], q.shape[-2], k.shape[-2], q.device)


@POSITIONS.register("alibi", AlibiOptions, score_bias=True, cost=bias_table_cost)
def _alibi(ctx: LayerContext, options: AlibiOptions) -> Positions:
    """ALiBi: per-head linear distance penalties on the scores (no learned parameters)."""
    return AlibiPositions(ctx, options)
