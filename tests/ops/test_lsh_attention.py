"""Reformer LSH attention: chunked fast path vs dense same-pairs reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.ops.lsh_attention import (
    chunk_pair_mask,
    default_n_buckets,
    draw_rotations,
    hash_buckets,
    lsh_attention,
    lsh_attention_naive,
    lsh_order,
)
from attnlab.utils.testing import assert_close

F64 = torch.float64


def _inputs(b=2, h=2, hk=2, t=37, d=8, dv=6, dtype=F64):
    q = torch.randn(b, h, t, d, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hk, t, d, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hk, t, dv, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_hashes", [1, 2])
@pytest.mark.parametrize(("t", "bucket_size", "hk", "padded"), [
    (37, 8, 2, True),  # T not a multiple of the bucket size, key padding
    (32, 8, 1, False),  # grouped heads, exact multiple
    (20, 16, 2, True),  # two chunks: the previous chunk of chunk 0 is chunk 1
])
def test_fast_matches_naive(causal, n_hashes, t, bucket_size, hk, padded):
    q, k, v = _inputs(t=t, hk=hk)
    rotations = draw_rotations(n_hashes, 8, default_n_buckets(t, bucket_size), dtype=F64)
    pad = (torch.rand(2, t) > 0.25) if padded else None
    kw = dict(n_hashes=n_hashes, bucket_size=bucket_size, causal=causal,
              generator_or_rotations=rotations, key_padding_mask=pad)
    out, ref = lsh_attention(q, k, v, **kw), lsh_attention_naive(q, k, v, **kw)
    assert_close("out", ref, out, 1e-12)
    grad = torch.randn_like(out)
    for name, g_out, g_ref in zip(
        "qkv", torch.autograd.grad(out, (q, k, v), grad),
        torch.autograd.grad(ref, (q, k, v), grad), strict=True,
    ):
        assert_close(f"d{name}", g_ref, g_out, 1e-11)


def test_causal_outputs_never_use_future_positions():
    q, k, v = _inputs(t=40)
    kw = dict(n_hashes=2, bucket_size=8, causal=True,
              generator_or_rotations=draw_rotations(2, 8, 6, dtype=F64))
    t0 = 17
    out = lsh_attention(q, k, v, **kw)
    # no gradient path from any future input (query, key or value) to earlier outputs
    grads = torch.autograd.grad(out[:, :, :t0].sum(), (q, k, v))
    for g in grads:
        assert torch.equal(g[:, :, t0:], torch.zeros_like(g[:, :, t0:]))
    assert all(g[:, :, :t0].abs().sum() > 0 for g in grads)
    # future values (which do not move the hashes) leave earlier outputs bitwise unchanged
    v2 = v.detach().clone()
    v2[:, :, t0:] = 1e4
    out2 = lsh_attention(q, k, v2, **kw)
    assert torch.equal(out[:, :, :t0], out2[:, :, :t0])


def _dense_without_self(q, k, v, causal):
    """Softmax over (q, normalised k) excluding the diagonal; row with nothing else -> itself."""
    t = q.shape[-2]
    k = F.normalize(k, dim=-1)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    allowed = ~torch.eye(t, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(t, t, dtype=torch.bool).tril()
    allowed[0, 0] = causal  # causal query 0 has only itself
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bucket_size", [23, 64])
def test_single_chunk_equals_full_attention_except_self(causal, bucket_size):
    q, k, v = _inputs(b=1, t=23)
    out = lsh_attention(q, k, v, n_hashes=2, bucket_size=bucket_size, causal=causal,
                        generator_or_rotations=torch.Generator().manual_seed(3))
    assert_close("single chunk", _dense_without_self(q, k, v, causal), out, 1e-12)
    if causal:
        assert torch.equal(out[:, :, 0], v[:, :, 0])  # self only as the last resort


def test_padded_keys_are_never_attended():
    q, k, v = _inputs(b=1, t=30)
    pad = torch.ones(1, 30, dtype=torch.bool)
    pad[0, [2, 9, 10, 29]] = False
    kw = dict(n_hashes=2, bucket_size=8, causal=False,
              generator_or_rotations=draw_rotations(2, 8, 4, dtype=F64), key_padding_mask=pad)
    out = lsh_attention(q, k, v, **kw)
    v2 = v.detach().clone()
    v2[..., ~pad[0], :] = 1e6
    out2 = lsh_attention(q, k, v2, **kw)
    assert_close("pad", out[..., pad[0], :], out2[..., pad[0], :], 1e-12)


def test_non_divisible_length_with_generator_is_deterministic():
    q, k, v = (x.detach().float() for x in _inputs(t=50))
    outs = [
        lsh_attention(q, k, v, n_hashes=2, bucket_size=16, causal=True,
                      generator_or_rotations=torch.Generator().manual_seed(0))
        for _ in range(2)
    ]
    assert outs[0].shape == (2, 2, 50, 6) and torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1])
    bf16 = lsh_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), n_hashes=2, bucket_size=16,
                         causal=True, generator_or_rotations=torch.Generator().manual_seed(0))
    assert bf16.dtype == torch.bfloat16 and torch.isfinite(bf16).all()


def test_hashing_and_chunk_structure():
    x = F.normalize(torch.randn(1, 1, 50, 8, dtype=F64), dim=-1)
    rotations = draw_rotations(3, 8, 8, dtype=F64)
    buckets = hash_buckets(x, rotations)
    assert buckets.shape == (1, 1, 3, 50) and buckets.min() >= 0 and buckets.max() < 8
    assert torch.equal(hash_buckets(-x, rotations), (buckets + 4) % 8)  # antipodal -> opposite
    order = lsh_order(x, rotations, bucket_size=16)  # padded to 64
    assert order.shape == (1, 1, 3, 64)
    assert torch.equal(order.sort(-1).values[0, 0, 0], torch.arange(64))
    assert (order[..., 50:] >= 50).all()  # padding fills the tail of the sorted order
    sorted_buckets = buckets.gather(-1, order[..., :50])
    assert (sorted_buckets.diff(dim=-1) >= 0).all()
    pairs = chunk_pair_mask(order, 16, 50)
    assert pairs.diagonal(dim1=-2, dim2=-1).all()
    assert (pairs.sum(-1) <= 32).all()


def test_argument_errors():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="rotations"):
        lsh_attention(q, k, v, n_hashes=2, bucket_size=8, causal=True,
                      generator_or_rotations=draw_rotations(1, 8, 4, dtype=F64))
    with pytest.raises(ValueError, match="even"):
        draw_rotations(1, 8, 5)
    with pytest.raises(ValueError, match="key_padding_mask"):
        lsh_attention(q, k, v, n_hashes=1, bucket_size=8, causal=True,
                      key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
