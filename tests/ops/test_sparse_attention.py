"""Attention over per-row key index lists: gather fast path vs dense reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from attnlab.ops.attention import softmax_attention
from attnlab.ops.sparse_attention import index_mask, sparse_attention, sparse_attention_naive
from attnlab.utils.testing import assert_close

F64 = torch.float64


def _qkv(b, h, hk, t_q, t_k, d=8, dv=5, dtype=F64):
    q = torch.randn(b, h, t_q, d, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hk, t_k, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hk, t_k, dv, dtype=dtype, requires_grad=True)
    return q, k, v


def _random_sets(b, h, t_q, t_k, s, p_valid=0.7):
    """Unique random keys per row, some slots invalid, rows 0 and 5 empty."""
    index = torch.rand(b, h, t_q, t_k).argsort(-1)[..., :s]
    valid = torch.rand(b, h, t_q, s) < p_valid
    valid[:, :, [0, 5]] = False
    index = index.masked_fill(~valid & (torch.rand_like(valid, dtype=F64) < 0.5), -1)
    return index, valid


def _causal_sets(b, h, t, s):
    """``s`` distinct random keys among each row's prefix (the whole prefix when shorter)."""
    future = torch.arange(t)[None, :] > torch.arange(t)[:, None]
    order = torch.rand(b, h, t, t).masked_fill(future, 2.0).argsort(-1)[..., :s]
    return order, order <= torch.arange(t)[:, None]


def _check_fast_vs_naive(q, k, v, index, valid, *, row_scale=None, query_chunk=7, scale=0.3):
    out = sparse_attention(q, k, v, index, valid, scale=scale, row_scale=row_scale,
                           query_chunk=query_chunk)
    ref = sparse_attention_naive(q, k, v, index, valid, scale=scale, row_scale=row_scale)
    assert_close("out", ref, out, 1e-12)
    inputs = [x for x in (q, k, v, row_scale) if x is not None]
    grad = torch.randn_like(out)
    for i, g_out, g_ref in zip(
        range(len(inputs)),
        torch.autograd.grad(out, inputs, grad),
        torch.autograd.grad(ref, inputs, grad),
        strict=True,
    ):
        assert_close(f"grad {'qkvr'[i]}", g_ref, g_out, 1e-11)
    return out


@pytest.mark.parametrize("hk", [4, 2, 1])
@pytest.mark.parametrize("with_row_scale", [True, False])
def test_fast_matches_naive_random_sets(hk, with_row_scale):
    q, k, v = _qkv(2, 4, hk, 30, 23)
    index, valid = _random_sets(2, 4, 30, 23, 6)
    row_scale = torch.rand(2, 4, 30, dtype=F64, requires_grad=True) if with_row_scale else None
    out = _check_fast_vs_naive(q, k, v, index, valid, row_scale=row_scale, query_chunk=7)
    assert torch.equal(out[:, :, [0, 5]], torch.zeros_like(out[:, :, [0, 5]]))


def test_gradcheck():
    q, k, v = _qkv(1, 2, 1, 9, 7, d=3, dv=2)
    index, valid = _random_sets(1, 2, 9, 7, 4)
    row_scale = torch.rand(1, 2, 9, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, r: sparse_attention(q, k, v, index, valid, scale=0.7, row_scale=r,
                                            query_chunk=4),
        (q, k, v, row_scale),
    )


def test_all_keys_valid_equals_dense_softmax_attention():
    q, k, v = _qkv(2, 4, 2, 19, 13)
    index = torch.rand(2, 4, 19, 13).argsort(-1)  # every key, in a random order per row
    valid = torch.ones_like(index, dtype=torch.bool)
    out = sparse_attention(q, k, v, index, valid, scale=0.5, query_chunk=8)
    sdpa = F.scaled_dot_product_attention(q, k, v, scale=0.5, enable_gqa=True)
    assert_close("vs sdpa", sdpa, out, 1e-12)


def test_causal_prefix_sets_equal_causal_attention():
    t = 24
    q, k, v = _qkv(1, 2, 2, t, t)
    index, valid = _causal_sets(1, 2, t, t)  # S = T: the whole prefix
    out = sparse_attention(q, k, v, index, valid, scale=0.35, query_chunk=10)
    assert_close("vs causal", softmax_attention(q, k, v, scale=0.35, causal=True), out, 1e-12)


def test_empty_rows_give_zero_output_and_zero_grads():
    q, k, v = _qkv(1, 2, 2, 6, 5)
    index = torch.zeros(1, 2, 6, 3, dtype=torch.long)
    valid = torch.zeros(1, 2, 6, 3, dtype=torch.bool)
    valid[0, 0, 1, 0] = True  # one non-empty row
    out = sparse_attention(q, k, v, index, valid, scale=1.0)
    out.sum().backward()
    empty = ~valid.any(-1)
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.equal(q.grad[empty], torch.zeros_like(q.grad[empty]))
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()
    assert torch.equal(out[0, 0, 1], v[0, 0, 0])
    none = sparse_attention(q, k, v, index[..., :0], valid[..., :0], scale=1.0)  # S = 0
    assert torch.equal(none, torch.zeros_like(none))


def test_index_mask_ignores_invalid_slots():
    index = torch.tensor([[[[2, 0, -1], [1, 1, 3]]]])
    valid = torch.tensor([[[[True, True, False], [False, True, True]]]])
    expected = torch.tensor([[[[True, False, True, False], [False, True, False, True]]]])
    assert torch.equal(index_mask(index, valid, 4), expected)


def test_low_precision_inputs():
    q, k, v = (x.detach().to(torch.bfloat16) for x in _qkv(1, 2, 2, 12, 12, dtype=torch.float32))
    index, valid = _causal_sets(1, 2, 12, 4)
    out = sparse_attention(q, k, v, index, valid, scale=0.4)
    assert out.dtype == torch.bfloat16
    ref = sparse_attention_naive(q.float(), k.float(), v.float(), index, valid, scale=0.4)
    assert_close("bf16", ref, out.float(), 1e-2)


@pytest.mark.parametrize("fn", [sparse_attention, sparse_attention_naive])
def test_validation_errors(fn):
    q, k, v = _qkv(1, 2, 2, 6, 5)
    index, valid = _random_sets(1, 2, 6, 5, 3)
    bad = index.clone()
    bad[0, 1, 2, 0], valid[0, 1, 2, 0] = 5, True
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        fn(q, k, v, bad, valid, scale=1.0)
    bad[0, 1, 2, 0] = -1
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        fn(q, k, v, bad, valid, scale=1.0)
    with pytest.raises(ValueError, match="key_index"):
        fn(q, k, v, index[:, :, :4], valid[:, :, :4], scale=1.0)
    with pytest.raises(ValueError, match="key_valid"):
        fn(q, k, v, index, valid[..., :2], scale=1.0)
    with pytest.raises(ValueError, match="row_scale"):
        fn(q, k, v, index, valid, scale=1.0, row_scale=torch.ones(1, 2, 5, dtype=F64))
    with pytest.raises(ValueError, match="multiple"):
        fn(q, k[:, :1].expand(1, 3, 5, 8), v[:, :1].expand(1, 3, 5, 5), index, valid, scale=1.0)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor (bytes) any op produces while active, backward included."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def _largest_and_saved(fn, t, s):
    q, k, v = _qkv(1, 2, 2, t, t, d=16, dv=16, dtype=torch.float32)
    index, valid = _causal_sets(1, 2, t, s) if t <= 1024 else _banded_sets(t, s)
    saved = []
    with _LargestTensor() as probe, torch.autograd.graph.saved_tensors_hooks(
        lambda x: saved.append(x.numel() * x.element_size()) or x, lambda x: x
    ):
        fn(q, k, v, index, valid, scale=0.25).sum().backward()
    return probe.largest, sum(saved)


def _banded_sets(t, s):
    """Causal sliding window of ``s`` keys for 2 heads, built without any T x T tensor."""
    index = torch.arange(t)[:, None] - torch.arange(s)[None, :]
    valid = index >= 0
    return index.expand(1, 2, t, s), valid.expand(1, 2, t, s)


def test_fast_path_never_allocates_a_t_by_t_tensor():
    t, s = 4096, 64
    largest, saved = _largest_and_saved(sparse_attention, t, s)
    # 4*T*T bytes is one float T x T matrix (64 MiB); the fast path's biggest tensor is the
    # int64 index list (T*S*H*8 = 4 MiB) or a chunk's gathered K/V (2 MiB)
    assert largest <= 2 * t * s * 8 < 4 * t * t // 8, largest
    # backward keeps only q, k, v (fp32), the int64 row ids and the bool validity: 6 MiB, where
    # saving every chunk's gathered K and V would take 2 * 2*T*S*16 * 4 bytes = 32 MiB
    assert saved <= 3 * 2 * t * 16 * 4 + 2 * t * s * (8 + 1), saved
    # the probe does catch a dense path
    dense_largest, _ = _largest_and_saved(sparse_attention_naive, 512, 16)
    assert dense_largest >= 2 * 512 * 512 * 4
