"""SEA's estimator: Performer + encoder + CNN, per query row compressed logits and scalers."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.base import LayerContext
from attnlab.layers.performer import (
    PerformerCore,
    PerformerCoreState,
    PerformerOptions,
    default_n_features,
)
from attnlab.layers.sea.cnn import CNN_CONTEXT_ROWS, BidirectionalCNN, CausalCNN, cat_row_masks
from attnlab.layers.sea.options import SEAOptions
from attnlab.ops.attention.masks import expand_kv_heads

# Query rows per pass of the estimator's encoder ([B, H, rows, 2d] activations).
ENCODER_ROWS = 256


@dataclasses.dataclass
class EstimatorState:
    """What the causal estimator carries between decoding calls.

    ``performer``: the Performer's running sums; ``image_rows``: the CNN input of the last (at
    most :data:`CNN_CONTEXT_ROWS`) estimated rows ``[B, 2H, R, K/4]`` and ``row_mask``
    ``[B, R]`` which of them are real queries (None = all); ``logits`` / ``scalers``: the last
    estimated row (``[B, H, 1, K]`` / ``[B, H, 1, 2]``), reused by the rows a query skip does
    not estimate. Its size does not depend on the number of keys.
    """

    performer: PerformerCoreState
    image_rows: Tensor
    row_mask: Tensor | None
    logits: Tensor
    scalers: Tensor


def relative_position_code(ranks: Tensor, lengths: Tensor, dim: int) -> Tensor:
    """Soft one-hot of ``rank / (L - 1)`` over ``dim`` bins (linear interpolation), SEA's
    bidirectional position code. ranks ``[B, T]``, lengths ``[B]`` -> ``[B, T, dim]``."""
    span = (lengths - 1).clamp_min(1).to(torch.float32).unsqueeze(-1)
    x = ranks.to(torch.float32) / span * (dim - 1)
    grid = torch.arange(dim, device=ranks.device, dtype=torch.float32)
    return (1 - (x.unsqueeze(-1) - grid).abs()).clamp_min(0)


def _row_blocks(n_rows: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, n_rows)) for start in range(0, n_rows, size)]


def stretched_rows(table: Tensor, factor: int, rows: int) -> Tensor:
    """``rows`` rows of ``table`` stretched ``factor`` times by nearest neighbour: row ``r``
    is ``table[r // factor]`` (SEA's causal position tables, trained on the first ranks
    only, read at a ``factor`` times longer context as SEA's long-context runs do)."""
    return table[torch.arange(rows, device=table.device) // factor]


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
        n_features = options.n_features or default_n_features(d, ctx.causal, "sea")
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

    def position_code(self, ranks: Tensor, n_real: Tensor) -> Tensor:
        """``[B or 1, 1, T, d]`` for keys of ``ranks`` ``[B or 1, T]`` (each key's rank among
        the real keys, so left padding shifts nothing): the learned table (causal; a rank
        past its end is an error) or the relative soft one-hot of the rank among ``n_real``
        ``[B or 1]`` real keys (bidirectional)."""
        if self.causal:
            return self.position_table[ranks][:, None]
        d = self.encoder[0].in_features // 3
        return relative_position_code(ranks, n_real, d).unsqueeze(1)

    def _check_ranks(self, ranks: Tensor, n_keys: int) -> None:
        """A rank past the learned table is an error; ranks are below ``n_keys``, so only
        contexts longer than the table pay for the (synchronising) check."""
        rows = self.position_table.shape[0] if self.causal else n_keys
        if n_keys > rows and int(ranks.max()) >= rows:
            raise ValueError(
                f"SEA's learned position table has max_seq_len={rows} rows, but a key is at "
                f"position {int(ranks.max())}; build the layer with a larger max_seq_len "
                "(attnlab long-context stretches a distilled table for you)"
            )

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
        key_ranks: Tensor,
        n_real: Tensor,
        query_skip: int,
        state: EstimatorState | None,
    ) -> tuple[Tensor, Tensor, EstimatorState | None]:
        """Returns (logits ``[B, H, Tq, K]``, scalers ``[B, H, Tq, 2]``, causal state or None).

        q ``[B, H, Tq, D]`` are the last ``Tq`` of the keys k, v ``[B, Hk, Tk, D]``. Without a
        ``state`` every key is read (O(Tk)); with one (causal decoding, made after the first
        ``Tk - Tq`` keys and usable: see :meth:`SEACore.forward`) only the new ``Tq``, so a
        step costs O(Tq). ``key_ranks`` ``[B or 1, n]``: rank among the real keys of the keys
        read (n = Tk, or Tq with a state); ``n_real`` ``[B or 1]``: real keys in all.
        """
        b, h, t_q, _ = q.shape
        t_k = k.shape[-2]
        self._check_ranks(key_ranks, t_k)
        first = t_k - t_q if state is not None else 0  # the keys the Performer reads
        code = self.position_code(key_ranks, n_real).to(v.dtype)
        v_aug = torch.cat((code.expand(b, v.shape[1], t_k - first, -1), v[..., first:, :]), -1)
        if state is None:
            perf = self.performer(q, k, v_aug, scale=scale, key_padding_mask=key_mask)
        else:
            perf = self.performer.extend(
                q, k[..., first:, :], v_aug, scale=scale, state=state.performer,
                key_padding_mask=None if key_mask is None else key_mask[:, first:],
            )
        v_q = expand_kv_heads(v[..., t_k - t_q:, :], h)
        if self.causal:
            positions = torch.arange(t_k - t_q, t_k, device=q.device)
            estimated = positions % query_skip == 0
            if state is None:
                estimated[0] = True  # nothing to reuse: estimate the first row
        else:
            estimated = torch.arange(t_q, device=q.device) % query_skip == 0
        every_row = query_skip == 1 or bool(estimated.all())
        perf_out = perf.out.to(v_q.dtype)
        if not every_row:
            rows = estimated.nonzero().squeeze(-1)
            perf_out, v_q = perf_out[..., rows, :], v_q[..., rows, :]
        scalers, image = self._features(perf_out, v_q)
        row_mask = None if key_mask is None else key_mask[:, t_k - t_q:]
        if row_mask is not None and not every_row:
            row_mask = row_mask[:, rows]
        new_state = None
        if self.causal:
            context = 0 if state is None else state.image_rows.shape[-2]
            window, window_mask = image, row_mask
            if state is not None:
                window = torch.cat((state.image_rows, image), dim=-2)
                window_mask = cat_row_masks(state.row_mask, row_mask, context, image.shape[-2])
            logits = self.cnn(window, window_mask) if state is None else \
                self.cnn.last_rows(window, window_mask, image.shape[-2])
            if not every_row:
                if state is not None:  # rows before this call's first estimate reuse the last
                    logits = torch.cat((state.logits, logits), dim=-2)
                    scalers = torch.cat((state.scalers, scalers), dim=-2)
                source = estimated.long().cumsum(0) - (0 if state is not None else 1)
                logits, scalers = logits[..., source, :], scalers[..., source, :]
            if perf.state is not None:
                new_state = EstimatorState(
                    perf.state, window[..., -CNN_CONTEXT_ROWS:, :],
                    None if window_mask is None else window_mask[:, -CNN_CONTEXT_ROWS:],
                    logits[..., -1:, :], scalers[..., -1:, :],
                )
            return logits, scalers, new_state
        logits = self.cnn(image, row_mask)
        if not every_row:
            source = torch.arange(t_q, device=q.device) // query_skip
            logits, scalers = logits[..., source, :], scalers[..., source, :]
        return logits, scalers, None
