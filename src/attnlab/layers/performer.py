"""Performer (FAVOR+) linear-attention core, with a constant-size decoding state.

Follows the Performer settings SEA uses: the FAVOR+ softmax kernel with orthogonal random
features for bidirectional attention, the generalised ReLU kernel for causal attention
(``kernel="auto"``), ``d_head * ln(d_head)`` features by default, float32 (or wider) compute
even under autocast, and optional periodic redraws of the random projection.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
from torch import Tensor

from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.registry import CORES
from attnlab.ops.performer import (
    PerformerState,
    orthogonal_gaussian,
    performer_attention,
    performer_attention_weights,
)

logger = logging.getLogger(__name__)

KERNELS = ("auto", "softmax", "relu")
FEATURE_RULES = ("performer", "sea")


@dataclasses.dataclass(frozen=True)
class PerformerOptions:
    """Options of the ``performer`` core.

    * ``kernel``: ``"softmax"`` (FAVOR+ positive random features, estimates softmax
      attention), ``"relu"`` (generalised kernel ``ReLU(x W^T) + 1e-3``) or ``"auto"`` (relu
      when causal, softmax otherwise, as in SEA).
    * ``n_features``: random features ``m``; None = the ``feature_rule``'s count.
    * ``feature_rule``: the default count: ``"performer"`` (``int(d_head * ln(d_head))``, at
      least 1) or ``"sea"`` (SEA's estimator's: an eighth of that when causal, 33 at
      ``d_head = 64``; the same when bidirectional), e.g. for a baseline with SEA's budget.
    * ``redraw_every``: draw a new projection before every ``N``-th training-mode forward after
      the first ``N`` (calls ``1..N`` use the initial one, ``N+1..2N`` the next, ...); 0 = never.
    * ``chunk_size``: causal chunk length of the prefix-sum computation (64 measured fastest
      for SEA's estimator on CPU at T=4096: 102 ms against 120 ms at 128, one thread).
    """

    kernel: str = "auto"
    n_features: int | None = None
    redraw_every: int = 0
    chunk_size: int = 64
    feature_rule: str = "performer"

    def validate(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {list(KERNELS)}, got {self.kernel!r}")
        if self.feature_rule not in FEATURE_RULES:
            raise ValueError(f"feature_rule must be one of {list(FEATURE_RULES)}, got "
                             f"{self.feature_rule!r}")
        if self.n_features is not None and self.n_features < 1:
            raise ValueError(f"n_features must be >= 1 (or null for the default), got "
                             f"{self.n_features}")
        if self.redraw_every < 0:
            raise ValueError(f"redraw_every must be >= 0 (0 = never), got {self.redraw_every}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")


def default_n_features(d_head: int, causal: bool = True, rule: str = "performer") -> int:
    """``int(d_head * ln(d_head))``, the Performer default, at least 1; ``rule="sea"``:
    SEA's estimator's count, ``d_head * ln(d_head) / 8`` when ``causal``."""
    divisor = 8 if rule == "sea" and causal else 1
    return max(1, int(d_head * math.log(d_head) / divisor))


@dataclasses.dataclass
class PerformerCoreState:
    """Causal decoding state of :class:`PerformerCore`.

    ``sums``: the op's :class:`PerformerState` over the first ``n_tokens`` key positions;
    ``projection_version``: which projection draw the sums were made with. A state that does not
    match the call (another length, e.g. a trimmed cache, or a redrawn projection) is not used:
    the core then recomputes from the keys it is given.
    """

    sums: PerformerState
    n_tokens: int
    projection_version: int


class PerformerCore(AttentionCore):
    """``performer_attention`` over the layer's q, k, v with a buffered random projection.

    Buffers (saved in the state dict, so a trained model reloads identically):
    ``projection`` ``[m, d_head]`` orthogonal Gaussian features; ``train_calls``: training-mode
    forwards so far (drives ``redraw_every``). Redraws use the global torch RNG.

    Causal decoding: in eval mode the output carries a :class:`PerformerCoreState`; called with
    it and a cache, only the new ``Tq`` queries and keys (the last ``Tq`` of k, v) are processed
    against the carried sums, O(1) in the cache length. Training-mode calls return no state
    (they recompute from the keys given, which honours a trimmed, detached Transformer-XL
    memory, and keep checkpointed memory free of custom objects).
    """

    exact_restart = True  # its state is sums over the cached keys

    def __init__(self, ctx: LayerContext, options: PerformerOptions) -> None:
        super().__init__()
        self.causal = ctx.causal
        kernel = options.kernel
        if kernel == "auto":
            kernel = "relu" if ctx.causal else "softmax"
        self.kernel = kernel
        self.chunk_size = options.chunk_size
        self.redraw_every = options.redraw_every
        n_features = options.n_features or default_n_features(ctx.d_head, ctx.causal,
                                                              options.feature_rule)
        self.register_buffer("projection", orthogonal_gaussian(n_features, ctx.d_head))
        self.register_buffer("train_calls", torch.zeros((), dtype=torch.long))
        self.projection_version = 0  # bumped by every redraw; decoding states remember it

    def extra_repr(self) -> str:
        m, d = self.projection.shape
        return f"kernel={self.kernel}, n_features={m}, d_head={d}, redraw_every={self.redraw_every}"

    @torch.no_grad()
    def redraw_projection(self) -> None:
        """Replace the projection by a fresh orthogonal Gaussian draw (global RNG)."""
        proj = self.projection
        proj.copy_(orthogonal_gaussian(*proj.shape, dtype=proj.dtype, device=proj.device))
        self.projection_version += 1

    def _count_training_call(self) -> None:
        if self.redraw_every == 0:
            return
        calls = int(self.train_calls)
        if calls and calls % self.redraw_every == 0:
            self.redraw_projection()
            logger.debug("performer projection redrawn after %d training calls", calls)
        self.train_calls.add_(1)

    def _usable(self, state: PerformerCoreState | None, n_cached: int) -> bool:
        return (
            isinstance(state, PerformerCoreState)
            and state.n_tokens == n_cached
            and state.projection_version == self.projection_version
        )

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_padding_mask: Tensor | None = None,
        score_bias: ScoreBias | None = None,
        state: PerformerCoreState | None = None,
    ) -> CoreOutput:
        """q ``[B, H, Tq, D]``, k ``[B, Hk, Tk, D]``, v ``[B, Hk, Tk, Dv]`` -> ``[B, H, Tq, Dv]``.

        Queries are the last ``Tq`` of the ``Tk`` key positions. ``key_padding_mask`` ``[B, Tk]``
        bool, True = real key. It takes no ``score_bias`` (no score matrix is formed).
        """
        if self.training:
            self._count_training_call()
        if not self.causal:
            with torch.autocast(q.device.type, enabled=False):  # feature maps need >= fp32
                out = performer_attention(
                    q, k, v, self.projection, causal=False, key_padding_mask=key_padding_mask,
                    kernel=self.kernel, scale=scale, chunk_size=self.chunk_size,
                )
            return CoreOutput(out)
        t_q, t_k = q.shape[-2], k.shape[-2]
        n_cached = t_k - t_q
        if self._usable(state, n_cached):
            k, v = k[..., n_cached:, :], v[..., n_cached:, :]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask[:, n_cached:]
        else:  # recompute the cached positions; their (zero) queries' outputs are dropped
            state = None
            if n_cached:
                q = torch.cat((q.new_zeros(*q.shape[:2], n_cached, q.shape[-1]), q), dim=-2)
        out = self.extend(q, k, v, scale=scale, key_padding_mask=key_padding_mask, state=state)
        return CoreOutput(out.out[..., -t_q:, :], state=out.state)

    def attention_weights(
        self, q: Tensor, k: Tensor, *, scale: float, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """``[B, H, Tq, Tk]``: the attention this core applies implicitly (the normalised
        ``phi(q) phi(k)^T``; O(T^2), for inspection). Shapes as in :meth:`forward`."""
        return performer_attention_weights(
            q, k, self.projection, kernel=self.kernel, causal=self.causal, scale=scale,
            key_padding_mask=key_padding_mask,
        )

    def extend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_padding_mask: Tensor | None = None,
        state: PerformerCoreState | None = None,
    ) -> CoreOutput:
        """Causal attention of new positions after ``state`` (None: after none).

        q ``[B, H, T, D]``, k ``[B, Hk, T, D]``, v ``[B, Hk, T, Dv]``: the ``T`` positions after
        the state's, queries and keys alike (``key_padding_mask`` ``[B, T]``); the state must
        be usable (same projection). O(T): the cached keys are not touched. Returns
        ``[B, H, T, Dv]`` and, in eval mode, the state after the new positions.
        """
        with torch.autocast(q.device.type, enabled=False):  # the feature maps need >= fp32
            out, sums = performer_attention(
                q, k, v, self.projection, causal=True, key_padding_mask=key_padding_mask,
                kernel=self.kernel, scale=scale, chunk_size=self.chunk_size,
                state=None if state is None else state.sums, return_state=True,
            )
        new_state = None
        if not self.training:
            n_tokens = k.shape[-2] + (0 if state is None else state.n_tokens)
            new_state = PerformerCoreState(sums, n_tokens, self.projection_version)
        return CoreOutput(out, state=new_state)


@CORES.register("performer", PerformerOptions, approximate=True, marker="D")
def _performer(ctx: LayerContext, options: PerformerOptions, dropout: float) -> PerformerCore:
    """Performer / FAVOR+ linear attention (softmax or generalised ReLU random features)."""
    return PerformerCore(ctx, options)
