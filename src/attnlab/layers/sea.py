"""SEA core: sparse attention on a mask estimated by a Performer + CNN (Lee et al., ICLR 2024).

Per query row: a Performer over ``[position code, v]`` and a small encoder/CNN estimate the
row's attention compressed into ``K = predictor_length`` bins that are stretched over the
row's own visible keys; the top cells within a budget (grouped across heads by default) are
decompressed into per-row lists of key runs (at most ``k`` keys per bin) and exact softmax
attention runs on those keys only (:func:`attnlab.ops.sparse_attention.cell_attention`,
O(T * H * k) work and memory).
The probabilities are scaled by ``sigmoid(s0)`` and the result is mixed with an average
context by ``sigmoid(s1)``. Every step costs O(T) in the sequence length.

The estimator does not get a gradient through the top-k selection. In training mode the core
therefore adds ``estimator_loss`` x loss (a) of the SEA recipe, with the layer's own dense
attention (detached, O(T^2) memory in training only) as the target; distillation from a
teacher replaces that target (see ``attnlab distill``).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.performer import PerformerCore, PerformerCoreState, PerformerOptions
from attnlab.layers.registry import CORES
from attnlab.ops.attention.masks import allowed_keys, expand_kv_heads
from attnlab.ops.sea import (
    GROUPS,
    attention_distill_loss,
    bin_edges,
    causal_mean,
    cell_runs,
    estimate_loss,
    estimate_weighted_mean,
    select_cell_list,
)
from attnlab.ops.sparse_attention import cell_mask, masked_attention, run_attention, run_keys

logger = logging.getLogger(__name__)

OUTPUTS = ("auto", "mix", "norm")
PATHS = ("auto", "sparse", "dense")
# Keys up to which the "auto" path attends through a dense masked matrix: measured on the
# 2-core dev box, training configs/tiny/cores/sea.yaml (T = 256, 8 heads, batch 8) ran at
# 1,957 tok/s this way against 1,015 with the cell gathers, whose many small ops (and
# checkpointed recomputation) dominate at short T.
DENSE_PATH_MAX_KEYS = 512
# Rows of past context the causal CNN sees: two 3-row convolutions with dilation 2.
CNN_CONTEXT_ROWS = 8
# Query rows whose cells are selected and attended together: the cell lists (and the top-k)
# are padded to the fullest row of a block, so a block must hold rows of similar length
# (causal rows of length 1..K have up to H*K cells of 1 key, long rows few cells of up to k
# keys). A block starting at a row of L visible keys spans max(ROW_BLOCK, L // 4) rows, so
# budgets within a causal block differ by at most 25%.
ROW_BLOCK = 64
# Query rows per pass of the estimator's encoder ([B, H, rows, 2d] activations).
ENCODER_ROWS = 256


@dataclasses.dataclass(frozen=True)
class SEAOptions:
    """Options of the ``sea`` core.

    * ``k``: keys per head the budget is sized for (a row gets about ``H * k`` keys). May be
      changed at inference without retraining (dynamic k: :meth:`SEACore.set_inference`).
    * ``predictor_length``: ``K``, bins of the compressed estimate (a multiple of 4).
    * ``topk_group``: ``"heads"`` (rank a row's ``H * K`` cells jointly, SEA's causal default)
      or ``"head"`` (each head's ``K`` cells with budget ``k * K / L_t``).
    * ``n_features``: Performer random features; None = ``d ln d / 8`` when causal (SEA's
      OPT setting), ``d ln d`` otherwise (BERT). ``kernel``: as the ``performer`` core
      ("auto" = ReLU when causal, FAVOR+ softmax otherwise). ``redraw_every``: Performer
      projection redraw period in training calls (0 = never).
    * ``query_skip``: run the encoder/CNN on every s-th query row only and reuse its estimate
      for the next ``s - 1`` rows (switchable at inference).
    * ``output``: ``"mix"`` (sigmoid(s1) mix only), ``"norm"`` (then ``LayerNorm(o) + o``, SEA's
      BERT form) or ``"auto"`` (mix when causal, norm otherwise).
    * ``gate_init``: initial bias of the two scaler logits ``s0, s1``. 0 (SEA's) starts both
      gates near 0.5, halving the attention and mixing in the average context; e.g. 4
      (sigmoid = 0.98) starts a model converted from a pretrained one at its teacher's
      attention restricted to the selected keys.
    * ``estimator_loss``: weight (averaged over layers) of the self-distillation loss on the
      estimate in training mode; 0 turns it off (e.g. when a teacher provides the target).
    * ``attention_path``: how the exact attention on the selected keys runs: ``"sparse"``
      (:func:`~attnlab.ops.sparse_attention.cell_attention`, O(T) memory), ``"dense"`` (the
      same mask scattered into a dense ``[B, H, rows, Tk]`` matrix: SEA's training-time
      simulation, O(T^2)) or ``"auto"`` (dense when ``Tk <=`` :data:`DENSE_PATH_MAX_KEYS`,
      where the dense form is faster on CPU; sparse otherwise). All give the same result.
    * ``query_chunk``: query rows per gather of the sparse attention (None = automatic).
    """

    k: int = 64
    predictor_length: int = 64
    topk_group: str = "heads"
    n_features: int | None = None
    kernel: str = "auto"
    redraw_every: int = 1000
    query_skip: int = 1
    output: str = "auto"
    gate_init: float = 0.0
    estimator_loss: float = 1.0
    attention_path: str = "auto"
    query_chunk: int | None = None

    def validate(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.predictor_length < 4 or self.predictor_length % 4:
            raise ValueError(
                f"predictor_length must be a positive multiple of 4, got {self.predictor_length}"
            )
        if self.topk_group not in GROUPS:
            raise ValueError(f"topk_group must be one of {list(GROUPS)}, got {self.topk_group!r}")
        if self.query_skip < 1:
            raise ValueError(f"query_skip must be >= 1, got {self.query_skip}")
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {list(OUTPUTS)}, got {self.output!r}")
        if self.attention_path not in PATHS:
            raise ValueError(f"attention_path must be one of {list(PATHS)}, got "
                             f"{self.attention_path!r}")
        if self.estimator_loss < 0:
            raise ValueError(f"estimator_loss must be >= 0, got {self.estimator_loss}")
        PerformerOptions(self.kernel, self.n_features, self.redraw_every).validate()


@dataclasses.dataclass
class SEAState:
    """Causal decoding state after ``n_tokens`` key positions.

    ``performer``: the estimator Performer's running sums; ``image_rows``: the CNN input of the
    last (at most :data:`CNN_CONTEXT_ROWS`) estimated rows ``[B, 2H, R, K/4]`` and
    ``row_mask`` ``[B, R]`` which of them are real queries (None = all); ``logits`` /
    ``scalers``: the last estimated row (``[B, H, 1, K]`` / ``[B, H, 1, 2]``), reused by the
    rows a query skip does not estimate.
    """

    performer: PerformerCoreState | None
    image_rows: Tensor
    row_mask: Tensor | None
    logits: Tensor
    scalers: Tensor
    n_tokens: int


def relative_position_code(ranks: Tensor, lengths: Tensor, dim: int) -> Tensor:
    """Soft one-hot of ``rank / (L - 1)`` over ``dim`` bins (linear interpolation), SEA's
    bidirectional position code. ranks ``[B, T]``, lengths ``[B]`` -> ``[B, T, dim]``."""
    span = (lengths - 1).clamp_min(1).to(torch.float32).unsqueeze(-1)
    x = ranks.to(torch.float32) / span * (dim - 1)
    grid = torch.arange(dim, device=ranks.device, dtype=torch.float32)
    return (1 - (x.unsqueeze(-1) - grid).abs()).clamp_min(0)


def _row_blocks(n_rows: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, n_rows)) for start in range(0, n_rows, size)]


def _keep_rows(x: Tensor, row_mask: Tensor | None) -> Tensor:
    """Zero the rows ``[B, C, R, W]`` of padded queries (``row_mask [B, R]``, True = real)."""
    return x if row_mask is None else x * row_mask[:, None, :, None]


class CausalCNN(nn.Module):
    """SEA's causal decoder: ``[B, 2H, R, K/4]`` rows -> ``[B, H, R, K]`` logits.

    dilated 3x3 conv -> ReLU -> dilated 3x3 conv -> ReLU -> nearest x4 along K -> 1x1 conv to
    H channels -> LayerNorm(K) (computed in the equivalent order of :meth:`forward`). Rows are
    padded above only, so row r sees rows ``<= r``. Rows of padded queries are zeroed after
    every convolution, like the padding above row 0, so padding values never leak into real
    rows.
    """

    def __init__(self, n_heads: int, width: int) -> None:
        super().__init__()
        channels = 2 * n_heads
        # Symmetric padding of 4 rows: output row r reads input rows r-4, r-2, r (causal); the
        # last 4 output rows, which would read rows below, are dropped in _conv.
        self.conv1 = nn.Conv2d(channels, channels, 3, dilation=2, padding=(4, 2))
        self.conv2 = nn.Conv2d(channels, channels, 3, dilation=2, padding=(4, 2))
        self.out = nn.Conv2d(channels, n_heads, 1)
        self.norm = nn.LayerNorm(4 * width)

    @staticmethod
    def _conv(conv: nn.Conv2d, x: Tensor, row_mask: Tensor | None) -> Tensor:
        return _keep_rows(F.relu(conv(x)[..., : x.shape[-2], :]), row_mask)

    def forward(self, image: Tensor, row_mask: Tensor | None = None) -> Tensor:
        # channels-last: measured 1.8x faster for these 2H-channel convs on CPU (oneDNN)
        x = _keep_rows(image, row_mask).contiguous(memory_format=torch.channels_last)
        x = self._conv(self.conv2, self._conv(self.conv1, x, row_mask), row_mask)
        # The 1x1 conv commutes with the x4 nearest upsample, and a LayerNorm over 4 copies of
        # each value has the statistics of the un-repeated row: both run at a quarter width,
        # and the affine map writes the 4 copies.
        y = self.out(x)
        y = F.layer_norm(y, y.shape[-1:], eps=self.norm.eps).unsqueeze(-1)
        w, b = self.norm.weight.view(-1, 4), self.norm.bias.view(-1, 4)
        return torch.addcmul(b, y, w).flatten(-2)


class BidirectionalCNN(nn.Module):
    """SEA's bidirectional decoder: ``[B, 4H, R, K/2]`` -> ``[B, H, R, K]`` logits.

    3x3 conv stride (2, 1) -> ReLU -> 3x3 conv -> ReLU -> nearest x2 along rows (cropped to R)
    -> 3x3 conv to H channels -> linear resize of the K axis to K. (SEA resizes both axes
    bilinearly; resizing only K keeps rows aligned, so right padding does not move them.)
    Rows of padded queries, and strided rows centred on one, are zeroed after each conv.
    """

    def __init__(self, n_heads: int, width: int) -> None:
        super().__init__()
        channels = 4 * n_heads
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.out = nn.Conv2d(channels, n_heads, 3, padding=1)
        self.width = 2 * width

    def forward(self, image: Tensor, row_mask: Tensor | None = None) -> Tensor:
        rows = image.shape[-2]
        strided_mask = None if row_mask is None else row_mask[:, ::2]
        x = _keep_rows(F.relu(self.conv1(_keep_rows(image, row_mask))), strided_mask)
        x = _keep_rows(F.relu(self.conv2(x)), strided_mask)
        x = self.out(_keep_rows(x.repeat_interleave(2, dim=-2)[..., :rows, :], row_mask))
        return F.interpolate(x, size=(rows, self.width), mode="bilinear", align_corners=False)


def _cat_masks(old: Tensor | None, new: Tensor | None, n_old: int, n_new: int) -> Tensor | None:
    """Concatenate two row masks ``[B, R]`` where None means all rows are real."""
    if old is None and new is None:
        return None
    ref = old if old is not None else new
    def full(m, n):
        return m if m is not None else ref.new_ones(ref.shape[0], n)
    return torch.cat((full(old, n_old), full(new, n_new)), dim=1)


class SEAEstimator(nn.Module):
    """Performer + encoder + CNN: per query row, compressed logits and the two scalers.

    Parameters are shared across heads (heads are batch rows of the MLPs and channels of the
    CNN). Submodule and parameter names start with the estimator's, so distillation can give
    them their own learning rate.
    """

    def __init__(self, ctx: LayerContext, options: SEAOptions) -> None:
        super().__init__()
        d, h, n_bins = ctx.d_head, ctx.n_heads, options.predictor_length
        self.causal = ctx.causal
        self.n_heads, self.n_bins = h, n_bins
        n_features = options.n_features
        if n_features is None:
            n_features = max(1, int(d * math.log(d) / (8 if ctx.causal else 1)))
        self.performer = PerformerCore(
            ctx, PerformerOptions(options.kernel, n_features, options.redraw_every)
        )
        if ctx.causal:  # SEA's OPT form: a learned table; bidirectional uses a fixed code
            self.position_table = nn.Parameter(torch.randn(ctx.max_seq_len, d))
        self.encoder = nn.Sequential(nn.Linear(3 * d, 2 * d), nn.LayerNorm(2 * d), nn.GELU())
        self.scalers = nn.Linear(2 * d, 2)
        nn.init.constant_(self.scalers.bias, options.gate_init)
        split = 2 if ctx.causal else 4
        self.split, self.image_width = split, n_bins * split // 8
        self.decoder = nn.Linear(2 * d, split * self.image_width)
        if ctx.causal:
            self.image_norm = nn.LayerNorm(self.image_width)
            self.cnn: nn.Module = CausalCNN(h, self.image_width)
        else:
            self.cnn = BidirectionalCNN(h, self.image_width)

    def position_code(self, key_mask: Tensor | None, t_k: int, device: torch.device) -> Tensor:
        """``[B or 1, 1, Tk, d]`` by each key's rank among the real keys (so left padding
        shifts nothing): the learned table (causal; ranks past its end reuse its last row) or
        the relative soft one-hot of the rank (bidirectional)."""
        if key_mask is None:
            ranks = torch.arange(t_k, device=device)[None]
        else:
            ranks = (key_mask.long().cumsum(-1) - 1).clamp_min(0)
        if self.causal:
            return self.position_table[ranks.clamp_max(self.position_table.shape[0] - 1)][:, None]
        d = self.encoder[0].in_features // 3
        lengths = torch.full((1,), t_k, device=device) if key_mask is None else key_mask.sum(-1)
        return relative_position_code(ranks, lengths, d).unsqueeze(1)

    def _row_features(self, perf: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder, scalers and decoder for rows ``perf [B, H, R, 2d]``, ``v [B, H, R, d]``:
        (scalers ``[B, H, R, 2]``, CNN input ``[B, split*H, R, width]``). The encoder's first
        linear layer is split by input block instead of concatenating ``[perf, v]``."""
        first, norm, act = self.encoder
        d_perf = perf.shape[-1]
        x = F.linear(perf, first.weight[:, :d_perf], first.bias)
        hidden = act(norm(x + F.linear(v, first.weight[:, d_perf:])))
        b, h, r, _ = hidden.shape
        image = self.decoder(hidden).view(b, h, r, self.split, self.image_width)
        image = image.transpose(2, 3).reshape(b, h * self.split, r, self.image_width)
        return self.scalers(hidden), self.image_norm(image) if self.causal else image

    def _features(self, perf: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`_row_features` :data:`ENCODER_ROWS` rows at a time, so the ``[B, H, R, 2d]``
        activations stay cache-sized (on CPU, fresh multi-MB tensors cost page faults)."""
        blocks = _row_blocks(perf.shape[-2], ENCODER_ROWS) or [slice(0, 0)]  # 0 rows: 1 block
        pieces = [self._row_features(perf[..., rows, :], v[..., rows, :]) for rows in blocks]
        if len(pieces) == 1:
            return pieces[0]
        return torch.cat([p[0] for p in pieces], -2), torch.cat([p[1] for p in pieces], -2)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_mask: Tensor | None,
        query_skip: int,
        state: SEAState | None,
    ) -> tuple[Tensor, Tensor, SEAState | None]:
        """Returns (logits ``[B, H, Tq, K]``, scalers ``[B, H, Tq, 2]``, causal state or None).

        ``state`` must be usable (see :meth:`SEACore.forward`) or None.
        """
        b, h, t_q, _ = q.shape
        t_k = k.shape[-2]
        code = self.position_code(key_mask, t_k, q.device).to(v.dtype)
        v_aug = torch.cat((code.expand(b, v.shape[1], t_k, -1), v), dim=-1)
        perf = self.performer(
            q, k, v_aug, scale=scale, key_padding_mask=key_mask,
            state=None if state is None else state.performer,
        )
        v_q = expand_kv_heads(v[..., t_k - t_q:, :], h)
        if self.causal:
            positions = torch.arange(t_k - t_q, t_k, device=q.device)
            estimated = positions % query_skip == 0
            if state is None:
                estimated[0] = True  # nothing to reuse: estimate the first row
        else:
            estimated = torch.arange(t_q, device=q.device) % query_skip == 0
        rows = estimated.nonzero().squeeze(-1)
        perf_out = perf.out.to(v_q.dtype)
        if rows.numel() < t_q:
            perf_out, v_q = perf_out[..., rows, :], v_q[..., rows, :]
        scalers, image = self._features(perf_out, v_q)
        row_mask = None if key_mask is None else key_mask[:, t_k - t_q:][:, rows]
        new_state = None
        if self.causal:
            context = 0 if state is None else state.image_rows.shape[-2]
            window, window_mask = image, row_mask
            if state is not None:
                window = torch.cat((state.image_rows, image), dim=-2)
                window_mask = _cat_masks(state.row_mask, row_mask, context, image.shape[-2])
            logits = self.cnn(window, window_mask)[..., context:, :]
            if state is not None:  # rows before this call's first estimate reuse the last one
                logits = torch.cat((state.logits, logits), dim=-2)
                scalers = torch.cat((state.scalers, scalers), dim=-2)
            source = estimated.long().cumsum(0) - (0 if state is not None else 1)
            if perf.state is not None:
                new_state = SEAState(
                    perf.state, window[..., -CNN_CONTEXT_ROWS:, :],
                    None if window_mask is None else window_mask[:, -CNN_CONTEXT_ROWS:],
                    logits[..., -1:, :], scalers[..., -1:, :], t_k,
                )
        else:
            logits = self.cnn(image, row_mask)
            source = torch.arange(t_q, device=q.device) // query_skip
        if state is None and rows.numel() == t_q:  # every row has its own estimate
            return logits, scalers, new_state
        return logits[..., source, :], scalers[..., source, :], new_state


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
        output = options.output
        if output == "auto":
            output = "mix" if ctx.causal else "norm"
        self.output_norm = nn.LayerNorm(ctx.d_head) if output == "norm" else None
        self.estimator = SEAEstimator(ctx, options)
        self.n_bins = options.predictor_length

    def extra_repr(self) -> str:
        return (f"k={self.k}, predictor_length={self.n_bins}, topk_group={self.topk_group}, "
                f"query_skip={self.query_skip}, causal={self.causal}")

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
        return (
            self.causal and not self.training and isinstance(state, SEAState)
            and state.n_tokens == n_cached
            and state.performer.projection_version == self.estimator.performer.projection_version
        )

    def _rows(self, key_mask: Tensor | None, b: int, t_q: int, t_k: int, device) -> tuple:
        """Visible keys per query row ``L_t`` ``[B, Tq]`` and the rank -> key position map
        ``[B, Tk]`` (None = identity)."""
        if key_mask is None:
            lengths = (torch.arange(t_k - t_q, t_k, device=device) + 1 if self.causal
                       else torch.full((t_q,), t_k, device=device)).expand(b, t_q)
            return lengths, None
        counts = key_mask.long().cumsum(-1)
        lengths = counts[:, t_k - t_q:] if self.causal else counts[:, -1:].expand(b, t_q)
        return lengths, torch.argsort((~key_mask).to(torch.uint8), dim=-1, stable=True)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_padding_mask: Tensor | None = None,
        score_bias: Tensor | None = None,
        state: SEAState | None = None,
    ) -> CoreOutput:
        """q ``[B, H, Tq, D]``, k ``[B, Hk, Tk, D]``, v ``[B, Hk, Tk, D]`` -> ``[B, H, Tq, D]``.

        Queries are the last ``Tq`` of the ``Tk`` key positions; ``key_padding_mask``
        ``[B, Tk]`` bool, True = real key. ``score_bias`` is not supported.
        """
        if score_bias is not None:
            raise ValueError(
                "the sea core cannot add a score bias (e.g. positions 'xl'); use positions "
                "'rope', 'learned' or 'none'"
            )
        b, h, t_q, d = q.shape
        t_k = k.shape[-2]
        if v.shape[-1] != d:
            raise ValueError(f"the sea core needs value width == head width, got {v.shape[-1]} "
                             f"and {d}")
        usable = state if self._usable(state, t_k - t_q) else None
        logits, scalers, new_state = self.estimator(
            q, k, v, scale=scale, key_mask=key_padding_mask, query_skip=self.query_skip,
            state=usable,
        )
        lengths, rank_to_pos = self._rows(key_padding_mask, b, t_q, t_k, q.device)
        probs = self._estimate_probs(logits, lengths)
        gates = torch.sigmoid(scalers.to(probs.dtype))
        ranking = self._ranking(probs)
        attended = torch.cat([
            self._attend(q[..., rows, :], k, v, ranking[..., rows, :], lengths[:, rows],
                         rank_to_pos, gates[..., rows, 0], scale)
            for rows in self._attention_blocks(t_q, t_k)
        ], dim=-2)
        mixed = self._mix(attended, gates[..., 1:], v, probs, lengths, key_padding_mask,
                          rank_to_pos)
        out = mixed if self.output_norm is None else self.output_norm(mixed) + mixed
        aux = {}
        if self.training and self.teacher_probs is not None:
            aux = self._distill_losses(q, k, scale, key_padding_mask, rank_to_pos, logits,
                                       lengths)
        elif self.training and self.loss_weight:

            def self_target_loss(q: Tensor, k: Tensor, logits: Tensor) -> Tensor:
                with torch.no_grad():
                    dense = self._dense_logits(q, k, scale, key_padding_mask)
                    probs = torch.softmax(dense, -1,
                                          dtype=torch.promote_types(dense.dtype, torch.float32))
                target = self._by_rank(probs.nan_to_num(0.0), rank_to_pos)
                return estimate_loss(logits, lengths, target)

            aux["sea_estimate"] = self.loss_weight * _recomputed(self_target_loss, q, k, logits)
        return CoreOutput(out.to(q.dtype), aux, new_state)

    def _distill_losses(self, q, k, scale, key_mask, rank_to_pos, logits, lengths) -> dict:
        """SEA's per-layer distillation losses against ``teacher_probs`` (each divided by the
        number of layers, so summing over layers averages): (a) ``sea_estimate``, the
        upsampled estimate, and (b) ``sea_attention``, the student's own dense softmax of
        q k^T (which trains the projections), each 0.1 KL + MSE."""
        teacher = self.teacher_probs
        expected = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        if tuple(teacher.shape) != expected:
            raise ValueError(f"teacher_probs must be [B, H, Tq, Tk] = {list(expected)}, got "
                             f"{list(teacher.shape)}")

        def losses(q: Tensor, k: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
            dense = self._dense_logits(q, k, scale, key_mask)
            dense = dense.masked_fill(~torch.isfinite(dense).any(-1, keepdim=True), 0.0)
            return (estimate_loss(logits, lengths, self._by_rank(teacher, rank_to_pos)),
                    attention_distill_loss(dense, teacher))

        estimate, attention = _recomputed(losses, q, k, logits)
        weight = 1.0 / self.n_layers
        return {"sea_estimate": weight * estimate, "sea_attention": weight * attention}

    def _attention_blocks(self, t_q: int, t_k: int) -> list[slice]:
        """Row blocks for :meth:`_attend` (see :data:`ROW_BLOCK`)."""
        blocks, start = [], 0
        while start < t_q:
            visible = t_k - t_q + start + 1 if self.causal else t_k
            end = min(t_q, start + max(ROW_BLOCK, visible // 4))
            blocks.append(slice(start, end))
            start = end
        return blocks

    def _attend(self, q, k, v, ranking, lengths, rank_to_pos, row_scale, scale) -> Tensor:
        """Select, decompress and attend for one block of query rows ``q [B, H, R, D]``."""
        head, bins, keep = select_cell_list(ranking, lengths, self.k, group=self.topk_group)
        lo, width, count = cell_runs(bins, keep, lengths, self.n_bins, cap=self.k)
        path = self.attention_path
        if path == "auto":
            path = "dense" if k.shape[-2] <= DENSE_PATH_MAX_KEYS else "sparse"
        if path == "dense":
            key_index, valid = run_keys(lo, width, count, rank_to_pos)
            mask = cell_mask(head, key_index, valid, q.shape[1], k.shape[-2])
            return masked_attention(q, k, v, mask, scale=scale, row_scale=row_scale)
        return run_attention(q, k, v, head, lo, count, width, scale=scale, row_scale=row_scale,
                             rank_to_pos=rank_to_pos, query_chunk=self.query_chunk,
                             validate=False)  # runs from cell_runs: in range by construction

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

    def _mix(self, attended, mix_gate, v, probs, lengths, key_mask, rank_to_pos) -> Tensor:
        """``sigmoid(s1) * attended + (1 - sigmoid(s1)) * average context``."""
        h, t_q = attended.shape[1], attended.shape[2]
        if self.causal:
            avg = expand_kv_heads(causal_mean(v, key_mask, t_q), h)
        else:
            v_by_rank = expand_kv_heads(v, h)
            if rank_to_pos is not None:
                index = rank_to_pos[:, None, :, None].expand_as(v_by_rank)
                v_by_rank = v_by_rank.gather(2, index)
            query_mask = None if key_mask is None else key_mask[:, -t_q:]
            avg = estimate_weighted_mean(v_by_rank, probs.clamp_min(0), lengths[:, 0], query_mask)
        return mix_gate * attended.to(mix_gate.dtype) + (1 - mix_gate) * avg

    def _dense_logits(self, q, k, scale, key_mask) -> Tensor:
        """The layer's full scaled ``q k^T`` ``[B, H, Tq, Tk]``, -inf at keys a row may not
        see (O(T^2): training targets only)."""
        scores = (q @ expand_kv_heads(k, q.shape[1]).transpose(-1, -2)) * scale
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


@CORES.register("sea", SEAOptions)
def _sea(ctx: LayerContext, options: SEAOptions, dropout: float) -> SEACore:
    """SEA: exact attention on a Performer+CNN-estimated sparse mask (linear in T)."""
    if dropout:
        logger.warning("the sea core does not apply attention dropout; dropout=%g is ignored",
                       dropout)
    return SEACore(ctx, options)
