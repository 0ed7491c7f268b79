"""Reformer LSH-attention core with shared query/key vectors.

Shared QK. Reformer hashes queries and keys with one LSH, which only groups similar vectors when
they are the same vectors: its keys are the L2-normalised queries. The core therefore uses the
(position-encoded) queries as keys and *ignores the ``k`` it is given*; with the ``dense``
projections the key projection then gets no gradient (the lead may add a shared-QK projections
part to drop it). Rotary positions stay consistent: query ``i`` is rotated at position ``i``,
exactly as a key at ``i`` would be.

KV cache. The keys of cached positions are their queries, which the layer does not cache, so
eval-mode causal calls return a :class:`ReformerState` holding the queries of every position so
far; the next call concatenates its new queries to them. A call with cached positions but no
matching state (training mode, a trimmed Transformer-XL memory) raises: shared-QK attention
cannot be recovered from the cached ``k``.

Rotations. The random rotations ``[n_hashes, d_head, n_buckets // 2]`` are a buffer drawn at
construction (saved in the state dict) and used in eval mode, so evaluation and decoding are
deterministic. With ``redraw_rotations`` (default), every training-mode forward hashes with
freshly drawn rotations from the global torch RNG, as Reformer does; the buffer is unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import Tensor

from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.registry import CORES
from attnlab.ops.lsh_attention import default_n_buckets, draw_rotations, lsh_attention

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ReformerOptions:
    """Options of the ``reformer`` core.

    * ``n_hashes``: hash rounds (combined by their softmax mass).
    * ``bucket_size``: chunk length. Bidirectional: chunks of the (bucket, position)-sorted
      order, each attending to itself and the previous chunk. Causal: chunks within each bucket
      (see :mod:`attnlab.ops.lsh_attention.causal`), so a query sees between ``bucket_size``
      and ``2 * bucket_size`` of its bucket's most recent keys.
    * ``n_buckets``: even, >= 2; None = ``default_n_buckets(max_seq_len, bucket_size)`` (about
      ``bucket_size`` positions per bucket at the maximum length).
    * ``redraw_rotations``: training-mode forwards hash with fresh random rotations; False
      keeps the stored ones in training too.
    """

    n_hashes: int = 2
    bucket_size: int = 64
    n_buckets: int | None = None
    redraw_rotations: bool = True

    def validate(self) -> None:
        if self.n_hashes < 1:
            raise ValueError(f"n_hashes must be >= 1, got {self.n_hashes}")
        if self.bucket_size < 1:
            raise ValueError(f"bucket_size must be >= 1, got {self.bucket_size}")
        if self.n_buckets is not None and (self.n_buckets < 2 or self.n_buckets % 2):
            raise ValueError(f"n_buckets must be even and >= 2 (or null), got {self.n_buckets}")


@dataclasses.dataclass
class ReformerState:
    """Causal decoding state: ``queries`` ``[B, H, Tc, D]``, the position-encoded queries of the
    ``Tc`` positions so far (the shared-QK keys)."""

    queries: Tensor


class ReformerCore(AttentionCore):
    """Shared-QK LSH attention through :func:`attnlab.ops.lsh_attention.lsh_attention`."""

    def __init__(self, ctx: LayerContext, options: ReformerOptions) -> None:
        super().__init__()
        self.causal = ctx.causal
        self.n_hashes = options.n_hashes
        self.bucket_size = options.bucket_size
        self.redraw_rotations = options.redraw_rotations
        n_buckets = options.n_buckets or default_n_buckets(ctx.max_seq_len, options.bucket_size)
        self.register_buffer("rotations", draw_rotations(options.n_hashes, ctx.d_head, n_buckets))

    def derived_options(self) -> dict[str, Any]:
        """``n_buckets`` (the rotations' shape), derived from ``max_seq_len`` when unset."""
        return {"n_buckets": 2 * self.rotations.shape[-1]}

    def extra_repr(self) -> str:
        return (
            f"n_hashes={self.n_hashes}, bucket_size={self.bucket_size}, "
            f"n_buckets={2 * self.rotations.shape[-1]}, redraw_rotations={self.redraw_rotations}"
        )

    def _hash_rotations(self) -> Tensor:
        if self.training and self.redraw_rotations:
            rot = self.rotations
            return draw_rotations(
                rot.shape[0], rot.shape[1], 2 * rot.shape[2], dtype=rot.dtype, device=rot.device
            )
        return self.rotations

    @staticmethod
    def _shared_keys(q: Tensor, n_cached: int, state: ReformerState | None) -> Tensor:
        """Keys of all ``n_cached + Tq`` positions: the cached queries, then ``q``."""
        if n_cached == 0:
            return q
        cached = state.queries if isinstance(state, ReformerState) else None
        if cached is None or cached.shape[-2] != n_cached or cached.shape[:2] != q.shape[:2]:
            covered = "no state" if cached is None else f"a state of {cached.shape[-2]} positions"
            raise RuntimeError(
                f"the reformer core shares queries and keys, so the {n_cached} cached positions "
                f"need their queries, kept in its decoding state, but it got {covered}. The "
                "state comes from eval-mode causal calls; training-mode caches and trimmed "
                "(Transformer-XL) memory are not supported"
            )
        return torch.cat((cached, q), dim=-2)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_padding_mask: Tensor | None = None,
        score_bias: ScoreBias | None = None,
        state: ReformerState | None = None,
    ) -> CoreOutput:
        """q ``[B, H, Tq, D]``, v ``[B, Hk, Tk, Dv]`` -> ``[B, H, Tq, Dv]``; ``k`` is ignored
        (shared QK, see the module docstring).

        Queries are the last ``Tq`` of the ``Tk`` positions. ``key_padding_mask`` ``[B, Tk]``
        bool, True = real key. It takes no ``score_bias``.
        """
        keys = self._shared_keys(q, k.shape[-2] - q.shape[-2], state)
        out = lsh_attention(
            q, keys, v, n_hashes=self.n_hashes, bucket_size=self.bucket_size,
            causal=self.causal, generator_or_rotations=self._hash_rotations(),
            key_padding_mask=key_padding_mask, scale=scale,
        )
        new_state = ReformerState(keys) if self.causal and not self.training else None
        return CoreOutput(out, state=new_state)


@CORES.register("reformer", ReformerOptions, memory=False, approximate=True)
def _reformer(ctx: LayerContext, options: ReformerOptions, dropout: float) -> ReformerCore:
    """Reformer shared-QK LSH attention (strictly causal per-bucket chunks when causal)."""
    return ReformerCore(ctx, options)
