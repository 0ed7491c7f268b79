"""Attention over runs of keys: native CPU kernel and PyTorch path vs the dense reference."""

from __future__ import annotations

import shutil

import pytest
import torch

from attnlab.ops.attention.bias import DistanceBias
from attnlab.ops.sea import cell_runs
from attnlab.ops.sparse_attention import (
    cell_attention,
    native,
    run_attention,
    run_attention_naive,
    run_keys,
)
from attnlab.utils.testing import assert_close

F64 = torch.float64
needs_native = pytest.mark.skipif(not native.available(), reason="no C++ compiler")


def _qkv(b, h, hk, t, d=8, dv=5, dtype=F64, grad=False):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(b, n, t, dim, dtype=dtype, generator=gen).requires_grad_(grad)
            for n, dim in ((h, d), (hk, d), (hk, dv))]


def _random_runs(b, h, t, c, seed=1):
    """Per row ``c`` disjoint runs of ranks on random heads (some thinned, some unused).
    Row 2 keeps no key at all."""
    gen = torch.Generator().manual_seed(seed)
    width = torch.randint(1, max(2, t // c), (b, t, c), generator=gen)
    gap = torch.randint(0, 2, (b, t, c), generator=gen)
    lo = (width + gap).cumsum(-1) - width
    fits = lo + width <= t
    count = torch.where(torch.rand(b, t, c, generator=gen) < 0.3,
                        torch.div(width + 1, 2, rounding_mode="floor"), width)
    count = torch.where(fits & (torch.rand(b, t, c, generator=gen) < 0.85), count, 0)
    count[:, 2] = 0
    head = torch.randint(0, h, (b, t, c), generator=gen)
    return head, lo.masked_fill(~fits, 0), count, width.masked_fill(~fits, 1)


def _rank_to_pos(b, t, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(t, generator=gen) for _ in range(b)])


def test_run_keys_thins_evenly_and_maps_ranks():
    lo, width, count = (torch.tensor([[[x]]]) for x in (3, 6, 3))
    index, valid = run_keys(lo, width, count)
    assert index[valid].tolist() == [3, 5, 7]
    r2p = torch.arange(10).flip(0)[None]
    index, valid = run_keys(lo, width, count, r2p)
    assert index[valid].tolist() == [6, 4, 2]


def test_cell_runs_are_the_bins_capped_at_k():
    lengths = torch.tensor([[10]])  # 4 bins of 10 ranks: edges 0, 3, 5, 8, 10 (half away)
    bins, keep = torch.tensor([[[0, 2, 3]]]), torch.tensor([[[True, True, False]]])
    lo, width, count = cell_runs(bins, keep, lengths, n_bins=4, cap=2)
    assert (lo.tolist(), width.tolist(), count.tolist()) == ([[[0, 5, 8]]], [[[3, 3, 2]]],
                                                             [[[2, 2, 0]]])


def _alibi(h, t, dtype, symmetric):
    """ALiBi's penalty over token positions 7..7+t (queries and keys alike)."""
    positions = torch.arange(7, 7 + t, dtype=dtype)
    slopes = torch.tensor([0.5, 0.25, 0.05, 0.0], dtype=dtype)[:h]
    return DistanceBias(slopes, positions, positions, symmetric=symmetric)


@needs_native
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [False, True])
def test_native_kernel_adds_alibi_penalties(monkeypatch, dtype, symmetric):
    """An ALiBi-form bias (DistanceBias) runs in the native kernel and matches the reference,
    which evaluates it as a function; it changes the result."""
    b, h, t = 2, 4, 24
    q, k, v = _qkv(b, h, 2, t, dtype=dtype)
    head, lo, count, width = _random_runs(b, h, t, c=5)
    r2p = _rank_to_pos(b, t)
    bias = _alibi(h, t, torch.float64 if dtype == F64 else torch.float32, symmetric)
    calls = []
    real = native.run_attention_native
    monkeypatch.setattr(native, "run_attention_native",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.no_grad():
        out = run_attention(q, k, v, head, lo, count, width, scale=0.3, rank_to_pos=r2p,
                            score_bias=bias)
    assert calls
    ref = run_attention_naive(q.double(), k.double(), v.double(), head, lo, count, width,
                              scale=0.3, rank_to_pos=r2p, score_bias=_alibi(h, t, F64, symmetric))
    tolerance = {F64: 1e-13, torch.float32: 1e-6, torch.bfloat16: torch.finfo(dtype).eps}
    assert_close("native", ref, out, tolerance[dtype])
    plain = run_attention_naive(q.double(), k.double(), v.double(), head, lo, count, width,
                                scale=0.3, rank_to_pos=r2p)
    assert (ref - plain).abs().max() > 1e-2


@needs_native
@pytest.mark.parametrize("hk", [4, 2, 1])
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mapped", [False, True])
def test_native_kernel_matches_reference(hk, dtype, mapped):
    b, h, t = 2, 4, 24
    q, k, v = _qkv(b, h, hk, t, dtype=dtype)
    head, lo, count, width = _random_runs(b, h, t, c=5)
    r2p = _rank_to_pos(b, t) if mapped else None
    row_scale = torch.rand(b, h, t, dtype=dtype)
    with torch.no_grad():
        assert native.supports(q, k, v, row_scale)
        out = run_attention(q, k, v, head, lo, count, width, scale=0.3, row_scale=row_scale,
                            rank_to_pos=r2p)
    ref = run_attention_naive(q.double(), k.double(), v.double(), head, lo, count, width,
                              scale=0.3, row_scale=row_scale.double(), rank_to_pos=r2p)
    assert out.dtype == dtype
    tolerance = {F64: 1e-13, torch.float32: 1e-6, torch.bfloat16: torch.finfo(dtype).eps}
    assert_close("native", ref, out, tolerance[dtype])
    assert (out[:, :, 2] == 0).all()  # a row without keys outputs exactly 0


@needs_native
def test_native_kernel_reads_strided_key_views_in_place(monkeypatch):
    """Keys and values as views of a larger reserved buffer (a KV cache with spare room) give
    the same result as contiguous copies, and are not copied."""
    b, h, t = 2, 4, 24
    q, k, v = _qkv(b, h, 2, t)
    spare_k, spare_v = (torch.randn(b, 2, t + 9, x.shape[-1], dtype=F64) for x in (k, v))
    spare_k[..., :t, :], spare_v[..., :t, :] = k, v
    k_view, v_view = spare_k[..., :t, :], spare_v[..., :t, :]
    assert not k_view.is_contiguous()
    head, lo, count, width = _random_runs(b, h, t, c=5)
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda x, *a, **kw: pytest.fail("copied")
                        if x.data_ptr() in (spare_k.data_ptr(), spare_v.data_ptr()) else x)
    with torch.no_grad():
        out = run_attention(q, k_view, v_view, head, lo, count, width, scale=0.3)
    monkeypatch.undo()
    ref = run_attention_naive(q, k, v, head, lo, count, width, scale=0.3)
    assert_close("strided", ref, out, 1e-13)


@needs_native
def test_native_kernel_is_used_without_autograd_only(monkeypatch):
    q, k, v = _qkv(1, 2, 2, 12, grad=True)
    head, lo, count, width = _random_runs(1, 2, 12, c=3)
    calls = []
    real = native.run_attention_native
    monkeypatch.setattr(native, "run_attention_native",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    out = run_attention(q, k, v, head, lo, count, width, scale=0.5)
    assert not calls and out.requires_grad
    with torch.no_grad():
        fast = run_attention(q, k, v, head, lo, count, width, scale=0.5)
    assert calls
    assert_close("paths", out.detach(), fast, 1e-13)


def test_runs_equal_cells_of_their_keys():
    q, k, v = _qkv(1, 3, 3, 20)
    head, lo, count, width = _random_runs(1, 3, 20, c=4)
    index, valid = run_keys(lo, width, count)
    cells = cell_attention(q, k, v, head, index, valid, scale=0.7)
    with torch.no_grad():
        runs = run_attention(q, k, v, head, lo, count, width, scale=0.7)
    assert_close("runs vs cells", cells, runs, 1e-13)


@pytest.mark.parametrize(("change", "match"), [
    ("head", "cell_head must lie"),
    ("count", r"cell_count must lie in \[0, cell_width\]"),
    ("lo", "runs must lie within"),
    ("float", "integer tensor"),
    ("rank_to_pos", "rank_to_pos must be"),
])
def test_bad_runs_are_rejected(change, match):
    q, k, v = _qkv(1, 2, 2, 10)
    head, lo, count, width = _random_runs(1, 2, 10, c=2)
    count[0, 0, 0], width[0, 0, 0], lo[0, 0, 0] = 2, 2, 0
    r2p = None
    if change == "head":
        head = head + 2
    elif change == "count":
        count[0, 0, 0] = 3
    elif change == "lo":
        lo[0, 0, 0] = 9
    elif change == "float":
        lo = lo.double()
    else:
        r2p = torch.arange(9)[None]
    with pytest.raises(ValueError, match=match):
        run_attention(q, k, v, head, lo, count, width, scale=1.0, rank_to_pos=r2p)


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="no C++ compiler")
def test_native_kernel_builds_where_a_compiler_exists():
    assert native.available()
    # loading it must not switch the process to flush-to-zero (as -ffast-math libraries do)
    tiny = torch.tensor([1e-39]) * torch.tensor([1.0])
    assert tiny.item() > 0


def test_disabled_native_kernel_falls_back(monkeypatch):
    monkeypatch.setenv("ATTNLAB_NATIVE", "0")
    native._library.cache_clear()
    try:
        assert not native.available()
        q, k, v = _qkv(1, 2, 2, 10)
        head, lo, count, width = _random_runs(1, 2, 10, c=2)
        with torch.no_grad():
            out = run_attention(q, k, v, head, lo, count, width, scale=1.0)
        ref = run_attention_naive(q, k, v, head, lo, count, width, scale=1.0)
        assert_close("fallback", ref, out, 1e-12)
    finally:
        native._library.cache_clear()
