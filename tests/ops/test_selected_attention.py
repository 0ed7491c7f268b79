"""SEA's selection + attention: the native kernel and the PyTorch path vs the dense reference."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention.bias import DistanceBias, offset_queries
from attnlab.ops.sea import attended_keys, selected_attention, selected_attention_naive
from attnlab.ops.sparse_attention import masked_attention, native
from attnlab.utils.testing import assert_close, assert_grads_close

F64 = torch.float64


def _inputs(b=2, h=4, hk=2, t_q=40, t_k=300, n_bins=16, dtype=F64, seed=0):
    """Queries as the last ``t_q`` of ``t_k`` keys, causal lengths (so short rows have empty
    bins), a random ranking with empty bins negative, and a rank -> position map."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t_q, 8, generator=gen, dtype=dtype)
    k, v = (torch.randn(b, hk, t_k, 8, generator=gen, dtype=dtype) for _ in range(2))
    lengths = torch.arange(t_k - t_q, t_k).add(1).expand(b, t_q).clone()
    lengths[1, :5] = torch.tensor([0, 1, 3, 9, 15])  # no key, and rows with L < K
    ranking = torch.rand(b, h, t_q, n_bins, generator=gen, dtype=dtype)
    edges = (2 * torch.arange(n_bins + 1) * lengths[..., None] + n_bins) // (2 * n_bins)
    empty = (edges[..., 1:] == edges[..., :-1]).unsqueeze(1)
    ranking = ranking.masked_fill(empty, -1.0)
    r2p = torch.stack([torch.randperm(t_k, generator=gen) for _ in range(b)])
    row_scale = torch.rand(b, h, t_q, generator=gen, dtype=dtype)
    return q, k, v, ranking, lengths, r2p, row_scale


@pytest.mark.skipif(not native.available(), reason="no C++ compiler")
@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("k_per_head", [3, 20, 400])  # sparse, capped bins, every key
@pytest.mark.parametrize("mapped", [False, True])
def test_native_kernel_matches_reference(dtype, k_per_head, mapped):
    q, k, v, ranking, lengths, r2p, row_scale = _inputs(dtype=dtype)
    kw = dict(scale=0.3, row_scale=row_scale, rank_to_pos=r2p if mapped else None)
    with torch.no_grad():
        assert native.supports(q, k, v, ranking, row_scale)
        out = selected_attention(q, k, v, ranking, lengths, k_per_head, causal=True, **kw)
    ref = selected_attention_naive(q.double(), k.double(), v.double(), ranking.double(),
                                   lengths, k_per_head, scale=0.3,
                                   row_scale=row_scale.double(), rank_to_pos=kw["rank_to_pos"])
    assert out.dtype == dtype
    assert_close("native", ref, out, 1e-13 if dtype == F64 else 1e-6)
    assert (out[1, :, 0] == 0).all()  # a row without keys outputs exactly 0


@pytest.mark.skipif(not native.available(), reason="no C++ compiler")
def test_bfloat16_is_computed_in_float32_and_rounded_once():
    """bfloat16 q, k, v (a bf16 model): scores and sums in float32, the output rounded to
    bf16; against the float64 reference on the same bf16 values, the error is that of one
    rounding (bf16's eps), and the selection the same."""
    q, k, v, ranking, lengths, r2p, row_scale = _inputs()
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    with torch.no_grad():
        assert native.supports(q, k, v, ranking.float(), row_scale.float())
        out = selected_attention(q, k, v, ranking.float(), lengths, 20, scale=0.3,
                                 causal=True, row_scale=row_scale.float(), rank_to_pos=r2p)
    ref = selected_attention_naive(q.double(), k.double(), v.double(), ranking, lengths, 20,
                                   scale=0.3, row_scale=row_scale, rank_to_pos=r2p)
    assert out.dtype == torch.bfloat16
    assert_close("bf16", ref, out, torch.finfo(torch.bfloat16).eps)


def test_native_kernel_reads_a_reserved_cache_view_in_place():
    if not native.available():
        pytest.skip("no C++ compiler")
    q, k, v, ranking, lengths, r2p, row_scale = _inputs()
    room = [torch.zeros(*x.shape[:2], x.shape[2] + 17, x.shape[3], dtype=F64) for x in (k, v)]
    for buffer, x in zip(room, (k, v), strict=True):
        buffer[..., : x.shape[2], :] = x
    views = [buffer[..., : k.shape[2], :] for buffer in room]
    with torch.no_grad():
        out = selected_attention(q, *views, ranking, lengths, 20, scale=0.3, causal=True)
    ref = selected_attention_naive(q, k, v, ranking, lengths, 20, scale=0.3)
    assert_close("views", ref, out, 1e-13)


def _bias_fn(t_k: int, seed: int = 3):
    """A learnable per-(head, key) bias plus a per-head distance slope: ``fn(b, h, i, j)``
    for queries that are the last rows of ``t_k`` keys, and its parameter."""
    table = torch.randn(4, t_k, generator=torch.Generator().manual_seed(seed), dtype=F64)
    table.requires_grad_()
    slopes = torch.tensor([0.3, 0.1, 0.05, 0.0], dtype=F64)

    def fn(b, h, i, j):
        return table[h, j] - slopes[h] * (i - j).abs()

    return fn, table


@pytest.mark.parametrize("activation", ["softmax1", "sigmoid"])
@pytest.mark.parametrize("dense", [False, True])
def test_score_activations_on_the_selected_keys(dense, activation):
    """softmax1 and sigmoid over the selected keys: the PyTorch paths against the reference
    (forward and gradients); without autograd the native kernel (softmax only) is skipped;
    and the result differs from softmax's."""
    q, k, v, ranking, lengths, r2p, row_scale = _inputs(t_q=70, t_k=70)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    kw = dict(scale=0.3, rank_to_pos=r2p, row_scale=row_scale, activation=activation,
              sigmoid_bias=-2.0)
    out = selected_attention(*leaves, ranking, lengths, 6, causal=True, dense=dense, **kw)
    ref = selected_attention_naive(*leaves, ranking, lengths, 6, **kw)
    assert_close("out", ref, out, 1e-12)
    assert_grads_close(ref, out, leaves, "qkv", 1e-11)
    with torch.no_grad():
        fast = selected_attention(q, k, v, ranking, lengths, 6, causal=True, **kw)
    assert_close("no autograd", ref, fast, 1e-12)
    softmax = selected_attention_naive(q, k, v, ranking, lengths, 6, scale=0.3,
                                       rank_to_pos=r2p, row_scale=row_scale)
    assert (ref - softmax).abs().max() > 1e-2


@pytest.mark.skipif(not native.available(), reason="no C++ compiler")
@pytest.mark.parametrize("symmetric", [False, True])
def test_the_native_kernel_selects_and_attends_with_alibi(monkeypatch, symmetric):
    """ALiBi's form (DistanceBias) stays on the native kernel, queries offset as in a later
    block of rows, and matches the reference."""
    q, k, v, ranking, lengths, r2p, row_scale = _inputs()
    bias = DistanceBias(torch.tensor([0.3, 0.1, 0.05, 0.0], dtype=F64),
                        torch.arange(300, dtype=F64)[-60:], torch.arange(300, dtype=F64),
                        symmetric=symmetric)
    bias = offset_queries(bias, 20)  # the last 40 of 60 queries
    calls = []
    real = native.select_attention_native
    monkeypatch.setattr(native, "select_attention_native",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    kw = dict(scale=0.3, rank_to_pos=r2p, row_scale=row_scale, score_bias=bias)
    with torch.no_grad():
        out = selected_attention(q, k, v, ranking, lengths, 20, causal=True, **kw)
    assert calls
    assert_close("native", selected_attention_naive(q, k, v, ranking, lengths, 20, **kw), out,
                 1e-13)


@pytest.mark.parametrize("dense", [False, True])
def test_a_score_bias_is_added_at_the_selected_keys(dense):
    """The PyTorch paths (over 2 row blocks, so the bias sees each block's row offset) against
    the reference, forward and gradients, the bias's own parameter included; and the
    reference against masked attention with the dense bias. Without autograd the native
    kernel (which takes no bias) is skipped."""
    q, k, v, ranking, lengths, r2p, row_scale = _inputs(t_q=70, t_k=70)
    fn, table = _bias_fn(70)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)] + [table]
    kw = dict(scale=0.3, rank_to_pos=r2p, row_scale=row_scale, score_bias=fn)
    out = selected_attention(*leaves[:3], ranking, lengths, 6, causal=True, dense=dense, **kw)
    ref = selected_attention_naive(*leaves[:3], ranking, lengths, 6, **kw)
    assert_close("out", ref, out, 1e-12)
    assert_grads_close(ref, out, leaves, "qkvb", 1e-11)
    unbiased = selected_attention_naive(q, k, v, ranking, lengths, 6, scale=0.3,
                                        rank_to_pos=r2p, row_scale=row_scale)
    assert (ref - unbiased).abs().max() > 1e-2
    with torch.no_grad():
        fast = selected_attention(q, k, v, ranking, lengths, 6, causal=True, **kw)
    assert_close("no autograd", ref, fast, 1e-12)


@pytest.mark.parametrize("group", ["heads", "head", "batch"])
@pytest.mark.parametrize("k_per_head", [3, 20])  # capped bins, whole bins
def test_attended_keys_are_the_keys_the_attention_uses(group, k_per_head):
    """Masked dense attention over ``attended_keys`` reproduces ``selected_attention``."""
    q, k, v, ranking, lengths, r2p, row_scale = _inputs(t_q=40, t_k=40)
    if group == "batch":
        lengths = torch.full_like(lengths, 40)  # bidirectional: every row sees every key
        ranking = ranking.abs()
    mask = attended_keys(ranking, lengths, k_per_head, 40, group=group, rank_to_pos=r2p)
    assert mask.shape == (2, 4, 40, 40) and mask.dtype == torch.bool
    out = selected_attention(q, k, v, ranking, lengths, k_per_head, scale=0.3,
                             causal=group != "batch", group=group, rank_to_pos=r2p)
    ref = masked_attention(q, k, v, mask, scale=0.3, row_scale=None)
    assert_close("attended", ref, out, 1e-13)
    assert 0 < int(mask.sum()) < mask.numel()  # sparse, not empty: the test can tell
