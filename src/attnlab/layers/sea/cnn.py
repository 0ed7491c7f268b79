"""SEA's CNN decoders: rows of the estimator's image -> compressed attention logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Rows of past context the causal CNN sees: two 3-row convolutions with dilation 2.
CNN_CONTEXT_ROWS = 8


def keep_rows(x: Tensor, row_mask: Tensor | None) -> Tensor:
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
        return keep_rows(F.relu(conv(x)[..., : x.shape[-2], :]), row_mask)

    def forward(self, image: Tensor, row_mask: Tensor | None = None) -> Tensor:
        # channels-last: measured 1.8x faster for these 2H-channel convs on CPU (oneDNN)
        x = keep_rows(image, row_mask).contiguous(memory_format=torch.channels_last)
        return self._head(self._conv(self.conv2, self._conv(self.conv1, x, row_mask), row_mask))

    def last_rows(self, window: Tensor, row_mask: Tensor | None, n: int) -> Tensor:
        """``forward(window, row_mask)[..., -n:, :]`` computing only what those rows read:
        the first conv on the ``n + 4`` rows the second reads, the second on ``n`` rows
        (decoding: ``n`` new rows after at most :data:`CNN_CONTEXT_ROWS` of context; measured
        60-100 us against 140-380 us for the whole window at batch 1-8, one thread)."""
        b, r = window.shape[0], window.shape[-2]
        if n == 0:  # a query-skipped step estimates no row
            return window.new_empty(b, self.out.out_channels, 0, self.norm.normalized_shape[0])
        first = r - n - CNN_CONTEXT_ROWS  # the window row of the first input read
        x = keep_rows(window, row_mask)[..., max(0, first):, :]
        mask = None if row_mask is None else row_mask[:, max(0, first):]
        if first < 0:  # rows above the sequence's first: zeros, as the convs' padding
            x = F.pad(x, (0, 0, -first, 0))
            real = torch.ones(b, r, dtype=torch.bool, device=x.device) if mask is None else mask
            mask = F.pad(real, (-first, 0), value=False)
        x = x.contiguous(memory_format=torch.channels_last)
        for conv, skip in ((self.conv1, 4), (self.conv2, 8)):  # each drops 4 rows above
            x = F.relu(F.conv2d(x, conv.weight, conv.bias, dilation=2, padding=(0, 2)))
            x = keep_rows(x, None if mask is None else mask[:, skip:])
        return self._head(x)

    def _head(self, x: Tensor) -> Tensor:
        """1x1 conv to H channels, x4 upsample and LayerNorm(K) of the second conv's rows."""
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
        x = keep_rows(F.relu(self.conv1(keep_rows(image, row_mask))), strided_mask)
        x = keep_rows(F.relu(self.conv2(x)), strided_mask)
        x = self.out(keep_rows(x.repeat_interleave(2, dim=-2)[..., :rows, :], row_mask))
        return F.interpolate(x, size=(rows, self.width), mode="bilinear", align_corners=False)


def cat_row_masks(old: Tensor | None, new: Tensor | None, n_old: int, n_new: int) -> Tensor | None:
    """Concatenate two row masks ``[B, R]`` where None means all rows are real."""
    if old is None and new is None:
        return None
    ref = old if old is not None else new
    def full(m, n):
        return m if m is not None else ref.new_ones(ref.shape[0], n)
    return torch.cat((full(old, n_old), full(new, n_new)), dim=1)
