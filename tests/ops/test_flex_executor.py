"""The FlexAttention executor of page selections and of the sinks + window: block masks and
the compiled kernel.

The contract suite checks the executor's eager form, which applies only the ``mask_mod``;
the compiled kernel also skips the tiles the block mask leaves out, so these tests check
that the tiles cover every key a row reads, that they are sparse, and that the compiled
kernel equals the reference (one compile per case, a few seconds on CPU)."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention.masks import key_ranks, rank_positions
from attnlab.ops.attention.window import (
    _allowed,
    _counts,
    window_attention,
    window_attention_naive,
    window_block_mask,
)
from attnlab.ops.contract import attention_inputs, padding_mask
from attnlab.ops.sparse_attention.executors import COMPILE_MIN_QUERIES
from attnlab.ops.sparse_attention.flex import attend_pages_flex, page_block_mask
from attnlab.ops.sparse_attention.pages import (
    PageSelection,
    attend_pages_naive,
    selection_keep,
)
from attnlab.utils.testing import assert_close


def _selection(gen: torch.Generator, t: int, *, page: int, n: int, padded: bool
               ) -> tuple[PageSelection, torch.Tensor | None]:
    """Causal rows of batch 2 and 2 KV heads, each reading its own page, the first and
    ``n - 2`` random earlier pages (a hole and left padding when ``padded``)."""
    padding = padding_mask(2, t) if padded else None
    ranks = key_ranks(padding, 2, t, None)
    q_ranks = ranks.clamp_min(0)
    own = (q_ranks // page)[:, None, :, None].expand(2, 2, t, 1)
    earlier = (torch.rand(2, 2, t, n - 2, generator=gen) * own).long()
    pages = torch.cat((own, torch.zeros_like(own), earlier), -1)
    repeated = (pages[..., :, None] == pages[..., None, :]).tril(-1).any(-1)
    pages = pages.masked_fill(repeated, -1)  # a page twice in a row: the second unused
    limit = (ranks + 1).clamp_min(0)
    return PageSelection(pages, page, limit, None if padding is None
                         else rank_positions(padding)), padding


def _blocks(keep: torch.Tensor, q_block: int, kv_block: int) -> torch.Tensor:
    """``[..., Tq, Tk]`` bool -> ``[..., Nq, Nk]``: the tiles holding a kept key."""
    t_q, t_k = keep.shape[-2:]
    keep = torch.nn.functional.pad(keep, (0, -t_k % kv_block, 0, -t_q % q_block))
    return keep.unflatten(-1, (-1, kv_block)).any(-1).unflatten(-2, (-1, q_block)).any(-2)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("q_block", "kv_block"), [(8, 4), (16, 8), (4, 16)])
def test_page_tiles_cover_every_read_key_and_skip_others(padded, q_block, kv_block):
    gen = torch.Generator().manual_seed(0)
    t, page = 96, 8
    selection, _ = _selection(gen, t, page=page, n=4, padded=padded)
    mask = page_block_mask(selection, 6, t, q_block=q_block, kv_block=kv_block)
    tiles = mask.to_dense().bool()  # [B, H, Nq, Nk]
    keep = selection_keep(selection, t)  # [B, Hk, Tq, Tk]
    keep &= (torch.arange(t) < selection.limit.max())[None, None, None]
    need = _blocks(keep, q_block, kv_block)
    tiles_kv = tiles[:, ::3]  # query heads 0 and 3: one per KV head
    assert (tiles_kv | ~need).all(), "a tile a row reads is missing"
    assert tiles_kv.sum() < tiles_kv.numel() * 0.75, "the tiles are not sparse"
    if not padded and q_block <= page and kv_block == page:
        assert torch.equal(tiles_kv, need)  # exact when a tile is within one page


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_page_kernel_equals_the_reference(padded, dtype):
    gen = torch.Generator().manual_seed(1)
    t = 2 * COMPILE_MIN_QUERIES
    selection, _ = _selection(gen, t, page=16, n=4, padded=padded)
    qkv = attention_inputs(gen, h=6, t_q=t, t_k=t)
    ref = attend_pages_naive(**qkv, selection=selection, scale=0.3)
    low = {name: x.to(dtype) for name, x in qkv.items()}
    with torch.no_grad():
        out = attend_pages_flex(**low, selection=selection, scale=0.3, q_block=32)
    if padded:  # padded queries read nothing: output 0
        assert out.transpose(1, 2)[selection.limit == 0].abs().max() == 0
    assert_close("compiled flex", ref.to(dtype).double(), out.double(),
                 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps)


def test_gradients_on_cpu_take_the_gather_path():
    gen = torch.Generator().manual_seed(2)
    selection, _ = _selection(gen, 40, page=4, n=3, padded=False)
    qkv = {n: x.requires_grad_() for n, x in attention_inputs(gen, h=6, t_q=40, t_k=40).items()}
    out = attend_pages_flex(**qkv, selection=selection, scale=0.3)
    out.square().sum().backward()
    ref_inputs = {n: x.detach().clone().requires_grad_() for n, x in qkv.items()}
    attend_pages_naive(**ref_inputs, selection=selection, scale=0.3).square().sum().backward()
    for name in qkv:
        assert_close(name, ref_inputs[name].grad, qkv[name].grad, 1e-12)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("sinks", "window"), [(0, 1), (4, 20), (3, 200)])
@pytest.mark.parametrize(("t_q", "q_block", "kv_block"), [(96, 8, 4), (96, 16, 16), (5, 4, 8)])
def test_window_tiles_cover_every_read_key_and_skip_others(padded, sinks, window, t_q,
                                                          q_block, kv_block):
    t = 96
    mask = padding_mask(2, t) if padded else None
    ranks = key_ranks(mask, 2, t, None)
    counts = _counts(ranks)
    block_mask = window_block_mask(ranks, counts, t_q, 4, sinks=sinks, window=window,
                                   q_block=q_block, kv_block=kv_block)
    tiles = block_mask.to_dense().bool()[:, 0]  # [B, Nq, Nk]; every head alike
    allowed = _allowed(ranks, counts, torch.arange(t - t_q, t), torch.arange(t), sinks,
                       window)[:, 0]
    need = _blocks(allowed, q_block, kv_block)
    assert (tiles | ~need).all(), "a tile a row reads is missing"
    if window < 100 and t_q == t:
        assert tiles.sum() < tiles.numel() * 0.6, "the tiles are not sparse"


@pytest.mark.parametrize("padded", [False, True])
def test_compiled_window_kernel_equals_the_reference(padded):
    gen = torch.Generator().manual_seed(3)
    t = 2 * COMPILE_MIN_QUERIES
    qkv = attention_inputs(gen, h=6, t_q=t, t_k=t)
    mask = padding_mask(2, t) if padded else None
    kw = dict(scale=0.3, sinks=4, window=24, key_padding_mask=mask)
    ref = window_attention_naive(**qkv, **kw)
    with torch.no_grad():
        out = window_attention(**{n: x.float() for n, x in qkv.items()}, **kw, executor="flex")
    real = slice(None) if mask is None else mask[:, None, :, None].expand_as(ref)
    assert_close("compiled flex window", ref[real], out.double()[real], 1e-5)
