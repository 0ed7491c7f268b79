"""The ``sea`` core: exact attention on the keys its estimator selects."""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.config import ConfigError
from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.registry import CORES
from attnlab.layers.sea.decoding import SEAState, key_layout
from attnlab.layers.sea.estimates import SEAEstimate
from attnlab.layers.sea.estimator import SEAEstimator
from attnlab.layers.sea.options import DENSE_PATH_MAX_KEYS, SEAOptions
from attnlab.ops.attention.activations import share_logits
from attnlab.ops.attention.bias import BiasFn, dense_bias, offset_queries
from attnlab.ops.attention.masks import allowed_keys, expand_kv_heads
from attnlab.ops.sea import (
    attention_distill_loss,
    bin_edges,
    causal_mean,
    estimate_loss,
    estimate_weighted_mean,
    selected_attention,
)
from attnlab.utils.threads import FEW_ROWS, single_threaded

logger = logging.getLogger(__name__)

# Query rows per block of a long causal prefill at inference (see forward). Measured with the
# core of bench attention (12 x 64, k = K = 64): at T = 4096, 156 ms in blocks of 1024 rows,
# 168 ms in one pass, 230 ms in blocks of 512; at 8192, 340 ms against 310 in one pass.
PREFILL_ROWS = 1024


class SEACore(AttentionCore):
    """SEA attention over the layer's q, k, v (causal or bidirectional; see module docstring).

    Causal decoding: in eval mode the output carries a :class:`SEAState`; a later call with
    it (and the cache's keys) estimates only the new rows, O(1) in the cache length for the
    estimator and O(k) keys per row for the attention. A state that does not match the call
    (training mode, a trimmed cache) is not used: the estimator then starts afresh on the
    given queries (the CNN sees no earlier rows and the Performer recomputes from the keys).
    """

    def __init__(self, ctx: LayerContext, options: SEAOptions) -> None:
        super().__init__()
        self.causal = ctx.causal
        self.k, self.query_skip = options.k, options.query_skip
        self.topk_group, self.query_chunk = options.topk_group, options.query_chunk
        self.attention_path = options.attention_path
        self.loss_weight = options.estimator_loss / ctx.n_layers
        self.n_layers = ctx.n_layers
        # A teacher's attention [B, H, Tq, Tk] for this layer during distillation (set around
        # one forward by attnlab.distill); in training mode it replaces the self-target.
        self.teacher_probs: Tensor | None = None
        # Where this core appends its estimates while attnlab.layers.sea.record_estimates
        # is active (None: not recording).
        self.estimate_sink: list[SEAEstimate] | None = None
        output = options.output
        if output == "auto":
            output = "mix" if ctx.causal else "norm"
        widths = {"norm": ctx.n_heads * ctx.d_head, "norm_head": ctx.d_head}
        self.output_norm = nn.LayerNorm(widths[output]) if output in widths else None
        self.estimator = SEAEstimator(ctx, options)
        self.n_bins = options.predictor_length
        self.activation = options.activation
        self.sigmoid_bias = options.scoring.resolved_sigmoid_bias(ctx.max_seq_len)

    def extra_repr(self) -> str:
        return (f"k={self.k}, predictor_length={self.n_bins}, topk_group={self.topk_group}, "
                f"query_skip={self.query_skip}, causal={self.causal}, "
                f"activation={self.activation!r}")

    def set_inference(self, *, k: int | None = None, query_skip: int | None = None) -> None:
        """Change the key budget (dynamic k) and/or the query skip; no retraining needed."""
        if k is not None:
            if k < 1:
                raise ValueError(f"k must be >= 1, got {k}")
            self.k = k
        if query_skip is not None:
            if query_skip < 1:
                raise ValueError(f"query_skip must be >= 1, got {query_skip}")
            self.query_skip = query_skip

    def _usable(self, state: SEAState | None, n_cached: int) -> bool:
        performer = self.estimator.performer
        return (
            self.causal and not self.training and isinstance(state, SEAState)
            and state.n_tokens == n_cached and n_cached > 0
            and state.estimator.performer.projection_version == performer.projection_version
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
        state: SEAState | None = None,
    ) -> CoreOutput:
        """q ``[B, H, Tq, D]``, k ``[B, Hk, Tk, D]``, v ``[B, Hk, Tk, D]`` -> ``[B, H, Tq, D]``.

        Queries are the last ``Tq`` of the ``Tk`` key positions; ``key_padding_mask``
        ``[B, Tk]`` bool, True = real key. A ``score_bias`` (ALiBi, Transformer-XL) is added
        to the exact scores of the selected keys and to the training losses' dense scores;
        the estimator sees q and k only and learns the bias's effect through its loss.
        """
        b, _, t_q, d = q.shape
        if v.shape[-1] != d:
            raise ValueError(f"the sea core needs value width == head width, got {v.shape[-1]} "
                             f"and {d}")
        threads = torch.get_num_threads()  # the native kernel's, over the rows
        bias = None if score_bias is None else score_bias.fn
        if not (self.causal and not self.training and t_q > PREFILL_ROWS):
            with single_threaded(b * t_q <= FEW_ROWS):
                return self._forward(q, k, v, scale, key_padding_mask, state, threads, bias)
        # A long causal prefill at inference: blocks of rows, each continuing the decoding
        # state of the last (the same result as one pass, as cached decoding is), so the
        # estimator's and the selection's [B, H, rows, ...] tensors stay block-sized.
        t_k, pieces = k.shape[-2], []
        for start in range(0, t_q, PREFILL_ROWS):
            stop = min(start + PREFILL_ROWS, t_q)
            keys = t_k - t_q + stop
            piece = self._forward(
                q[..., start:stop, :], k[..., :keys, :], v[..., :keys, :], scale,
                None if key_padding_mask is None else key_padding_mask[:, :keys], state, threads,
                None if bias is None else offset_queries(bias, start),
            )
            pieces.append(piece.out)
            state = piece.state
        return CoreOutput(torch.cat(pieces, dim=-2), {}, state)

    def _forward(self, q, k, v, scale, key_padding_mask, state, threads,
                 bias: BiasFn | None) -> CoreOutput:
        b, h, t_q, _ = q.shape
        t_k = k.shape[-2]
        usable = state if self._usable(state, t_k - t_q) else None
        layout = key_layout(key_padding_mask, b, t_q, t_k, causal=self.causal, state=usable,
                            device=q.device)
        lengths, rank_to_pos = layout.lengths, layout.rank_to_pos
        logits, scalers, estimator_state = self.estimator(
            q, k, v, scale=scale, key_mask=key_padding_mask, key_ranks=layout.key_ranks,
            n_real=layout.n_real, query_skip=self.query_skip,
            state=None if usable is None else usable.estimator,
        )
        probs = self._estimate_probs(logits, lengths)
        gates = torch.sigmoid(scalers.to(probs.dtype))
        ranking = self._ranking(probs)
        if not self.causal and key_padding_mask is not None:  # padded rows select nothing
            ranking = ranking.masked_fill(~key_padding_mask[:, None, -t_q:, None], -1.0)
        if self.estimate_sink is not None:
            self.estimate_sink.append(SEAEstimate(
                probs.detach().clamp_min(0), lengths, rank_to_pos, t_k, ranking.detach(),
                self.k, self.topk_group))
        path = self.attention_path
        if path == "auto":
            path = "dense" if t_k <= DENSE_PATH_MAX_KEYS else "sparse"
        attended = selected_attention(
            q, k, v, ranking, lengths, self.k, scale=scale, causal=self.causal,
            group=self.topk_group, row_scale=gates[..., 0], rank_to_pos=rank_to_pos,
            dense=path == "dense", query_chunk=self.query_chunk, threads=threads,
            score_bias=bias, activation=self.activation, sigmoid_bias=self.sigmoid_bias,
        )
        if self.causal:
            first = t_k - t_q if usable is not None else 0
            new_mask = None if key_padding_mask is None else key_padding_mask[:, first:]
            avg, (value_sum, _) = causal_mean(
                v[..., first:, :], new_mask, t_q,
                prefix=None if usable is None else (usable.value_sum, usable.n_real),
            )
            avg = expand_kv_heads(avg, h)
        else:
            avg = self._estimated_mean(v, probs, lengths, key_padding_mask, rank_to_pos)
        mix_gate = gates[..., 1:]
        mixed = mix_gate * attended.to(mix_gate.dtype) + (1 - mix_gate) * avg
        new_state = None
        if estimator_state is not None:
            new_state = SEAState(estimator_state, layout.n_real, value_sum, t_k)
        out = mixed if self.output_norm is None else self._normed(mixed) + mixed
        aux = {}
        if self.training and self.teacher_probs is not None:
            aux = self._distill_losses(q, k, scale, key_padding_mask, bias, rank_to_pos,
                                       logits, lengths)
        elif self.training and self.loss_weight:

            def self_target_loss(q: Tensor, k: Tensor, logits: Tensor) -> Tensor:
                with torch.no_grad():
                    probs = self._exact_probs(q, k, scale, key_padding_mask, bias)
                target = self._by_rank(probs, rank_to_pos)
                return estimate_loss(logits, lengths, target, self._kl_rows(q, key_padding_mask))

            aux["sea_estimate"] = self.loss_weight * _recomputed(self_target_loss, q, k, logits)
        return CoreOutput(out.to(q.dtype), aux, new_state)

    def _distill_losses(self, q, k, scale, key_mask, bias, rank_to_pos, logits,
                        lengths) -> dict:
        """SEA's per-layer distillation losses against ``teacher_probs`` (each divided by the
        number of layers, so summing over layers averages): (a) ``sea_estimate``, the
        upsampled estimate, and (b) ``sea_attention``, the student's own dense attention over
        every key (which trains the projections), each 0.1 KL + MSE. Both compare each key's
        share of its row's weight (the teacher's weights normalised per row; the same as its
        probabilities for a softmax teacher)."""
        teacher = self.teacher_probs
        expected = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        if tuple(teacher.shape) != expected:
            raise ValueError(f"teacher_probs must be [B, H, Tq, Tk] = {list(expected)}, got "
                             f"{list(teacher.shape)}")
        teacher = teacher / teacher.sum(-1, keepdim=True).clamp_min(torch.finfo(teacher.dtype).tiny)
        kl_rows = self._kl_rows(q, key_mask)

        def losses(q: Tensor, k: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
            dense = self._share_logits(q, k, scale, key_mask, bias)
            dense = dense.masked_fill(~torch.isfinite(dense).any(-1, keepdim=True), 0.0)
            return (estimate_loss(logits, lengths, self._by_rank(teacher, rank_to_pos), kl_rows),
                    attention_distill_loss(dense, teacher, kl_rows))

        estimate, attention = _recomputed(losses, q, k, logits)
        weight = 1.0 / self.n_layers
        return {"sea_estimate": weight * estimate, "sea_attention": weight * attention}

    def attention_weights(
        self, q: Tensor, k: Tensor, v: Tensor, *, scale: float,
        key_padding_mask: Tensor | None = None, score_bias: ScoreBias | None = None,
    ) -> Tensor:
        """``[B, H, Tq, Tk]``: the exact attention of this layer's q, k over every key (what
        SEA's estimate approximates; O(T^2), for inspection). Arguments as in :meth:`forward`
        (``v`` is not read)."""
        return self._exact_probs(q, k, scale, key_padding_mask,
                                 None if score_bias is None else score_bias.fn)

    def _exact_probs(self, q, k, scale, key_mask, bias: BiasFn | None) -> Tensor:
        """The softmax of :meth:`_share_logits` in at least float32, 0 in rows with no key."""
        logits = self._share_logits(q, k, scale, key_mask, bias)
        probs = torch.softmax(logits, -1, dtype=torch.promote_types(logits.dtype, torch.float32))
        return probs.nan_to_num(0.0)

    def _kl_rows(self, q: Tensor, key_mask: Tensor | None) -> int | None:
        """What the losses' KL is divided by: every row when causal ("batchmean"), the real
        query tokens when bidirectional (SEA's BERT form: the heads' KLs add up)."""
        if self.causal:
            return None
        t_q = q.shape[-2]
        return q.shape[0] * t_q if key_mask is None else int(key_mask[:, -t_q:].sum())

    def _normed(self, x: Tensor) -> Tensor:
        """``output_norm`` of ``[B, H, T, D]``: over the concatenated heads, or per head."""
        if self.output_norm.normalized_shape[0] == x.shape[-1]:
            return self.output_norm(x)
        b, h, t, d = x.shape
        joined = self.output_norm(x.transpose(1, 2).reshape(b, t, h * d))
        return joined.view(b, t, h, d).transpose(1, 2)

    def _estimate_probs(self, logits: Tensor, lengths: Tensor) -> Tensor:
        """Softmax over each row's non-empty bins (empty bins get -1, never selected), in at
        least float32."""
        edges = bin_edges(lengths, self.n_bins)
        empty = (edges[..., 1:] == edges[..., :-1]).unsqueeze(1)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        probs = torch.softmax(logits.masked_fill(empty, float("-inf")), dim=-1)
        return torch.nan_to_num(probs, nan=0.0).masked_fill(empty, -1.0)

    def _ranking(self, probs: Tensor) -> Tensor:
        """What the top-k ranks: the estimate with exact ties broken toward the lower bin.

        The causal CNN upsamples x4 before a pointwise conv, so bins come in runs of 4 equal
        logits; rounding noise (a cached step vs the full pass) would otherwise decide those
        ties at random. The bias, ``1000 * eps`` per bin inside a run, is far above the noise
        and far below real differences (at most 3.6e-4 in float32, 6.7e-13 in float64).
        """
        step = 1000 * torch.finfo(probs.dtype).eps
        within = torch.arange(self.n_bins, device=probs.device) % 4
        return torch.where(probs >= 0, probs - step * within, probs)

    @staticmethod
    def _estimated_mean(v, probs, lengths, key_mask, rank_to_pos) -> Tensor:
        """The bidirectional average context: values weighted by the mean estimate."""
        v_by_rank = expand_kv_heads(v, probs.shape[1])
        if rank_to_pos is not None:
            index = rank_to_pos[:, None, :, None].expand_as(v_by_rank)
            v_by_rank = v_by_rank.gather(2, index)
        query_mask = None if key_mask is None else key_mask[:, -probs.shape[2]:]
        return estimate_weighted_mean(v_by_rank, probs.clamp_min(0), lengths[:, 0], query_mask)

    def _share_logits(self, q, k, scale, key_mask, bias: BiasFn | None) -> Tensor:
        """``[B, H, Tq, Tk]`` logits whose softmax is each key's share of its row's weight
        (:func:`~attnlab.ops.attention.activations.share_logits` of the layer's full scaled
        ``q k^T`` plus the score bias), -inf at keys a row may not see (O(T^2): training
        targets only)."""
        scores = (q @ expand_kv_heads(k, q.shape[1]).transpose(-1, -2)) * scale
        if bias is not None:
            queries = torch.arange(q.shape[-2], device=q.device)
            scores = scores + dense_bias(bias, q.shape[0], q.shape[1], queries, k.shape[-2])
        scores = share_logits(scores, self.activation, self.sigmoid_bias)
        allowed = allowed_keys(q.shape[-2], k.shape[-2], causal=self.causal,
                               key_padding_mask=key_mask, device=q.device)
        return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))

    @staticmethod
    def _by_rank(probs: Tensor, rank_to_pos: Tensor | None) -> Tensor:
        """Attention ``[B, H, Tq, Tk]`` over key positions -> over key ranks."""
        if rank_to_pos is None:
            return probs
        return probs.gather(-1, rank_to_pos[:, None, None, :].expand_as(probs))


def _recomputed(fn, *tensors: Tensor):
    """``fn(*tensors)``; in a backward pass its ``[B, H, Tq, Tk]`` intermediates (the
    training losses' dense attention maps, several per layer) are recomputed instead of being
    kept from the forward, so training memory does not grow with ``T^2`` per layer."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return checkpoint(fn, *tensors, use_reentrant=False)
    return fn(*tensors)


@CORES.register("sea", SEAOptions, score_bias=True, approximate=True,
                tunable_inference=True, learns_attention=True, budget=("k",), marker="o")
def _sea(ctx: LayerContext, options: SEAOptions, dropout: float) -> SEACore:
    """SEA: exact attention on a Performer+CNN-estimated sparse mask (linear in T)."""
    if ctx.causal and options.topk_group == "batch":
        raise ConfigError("the sea core's topk_group 'batch' ranks a sample's cells across "
                          "rows, so a row's keys would depend on later rows: bidirectional "
                          "only; a causal model takes 'heads' or 'head'")
    return SEACore(ctx, options)
