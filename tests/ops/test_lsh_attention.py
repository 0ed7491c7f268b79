"""Reformer LSH attention: decoding, causality, padding, hashing and chunk structure (the
chunked fast paths against the dense same-pairs references: test_contract)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.ops.lsh_attention import (
    causal_pair_mask,
    causal_slot_count,
    causal_slot_layout,
    chunk_pair_mask,
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


def _assert_grads_match(out, ref, inputs):
    grad = torch.randn_like(out)
    for name, g_out, g_ref in zip(
        "qkv", torch.autograd.grad(out, inputs, grad),
        torch.autograd.grad(ref, inputs, grad), strict=True,
    ):
        assert_close(f"d{name}", g_ref, g_out, 1e-11)


@pytest.mark.parametrize("t_q", [1, 6])
def test_causal_queries_of_the_last_positions_match_the_full_pass(t_q):
    """Decoding: the last ``t_q`` queries against all keys (each query gathers its window)."""
    q, k, v = _inputs(t=41)
    pad = torch.rand(2, 41) > 0.2
    kw = dict(n_hashes=2, bucket_size=4, causal=True, key_padding_mask=pad,
              generator_or_rotations=draw_rotations(2, 8, 4, dtype=F64))
    out = lsh_attention(q[:, :, -t_q:], k, v, **kw)
    ref = lsh_attention_naive(q, k, v, **kw)[:, :, -t_q:]
    assert out.shape == (2, 2, t_q, 6)
    assert_close("out", ref, out, 1e-12)
    _assert_grads_match(out, ref, (q, k, v))


def test_causal_outputs_never_use_future_positions():
    q, k, v = _inputs(t=40)
    rotations = draw_rotations(2, 8, 6, dtype=F64)
    kw = dict(n_hashes=2, bucket_size=4, causal=True, generator_or_rotations=rotations)
    t0 = 17
    out = lsh_attention(q, k, v, **kw)
    # no gradient path from any future input (query, key or value) to earlier outputs
    grads = torch.autograd.grad(out[:, :, :t0].sum(), (q, k, v))
    for g in grads:
        assert torch.equal(g[:, :, t0:], torch.zeros_like(g[:, :, t0:]))
    assert all(g[:, :, :t0].abs().sum() > 0 for g in grads)
    # new future queries, keys and values: the future hashes move (which shifts every chunk
    # boundary of sort-and-chunk LSH), yet earlier outputs stay bitwise identical
    q2, k2, v2 = (x.detach().clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t0:] = 3 * torch.randn_like(x[:, :, t0:])
    old_buckets = hash_buckets(F.normalize(k.detach(), dim=-1), rotations)
    new_buckets = hash_buckets(F.normalize(k2, dim=-1), rotations)
    assert not torch.equal(old_buckets[..., t0:], new_buckets[..., t0:])
    out2 = lsh_attention(q2, k2, v2, **kw)
    assert torch.equal(out[:, :, :t0], out2[:, :, :t0])
    assert not torch.allclose(out[:, :, t0:], out2[:, :, t0:])


def _dense_without_self(q, k, v, allowed):
    """Softmax over (q, normalised k) on ``allowed`` pairs minus the diagonal; a row with
    nothing else attends to itself."""
    t = q.shape[-2]
    k = F.normalize(k, dim=-1)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    others = allowed & ~torch.eye(t, dtype=torch.bool)
    others = others | (torch.eye(t, dtype=torch.bool) & ~others.any(-1, keepdim=True))
    return torch.softmax(scores.masked_fill(~others, float("-inf")), -1) @ v


@pytest.mark.parametrize("bucket_size", [23, 64])
def test_single_chunk_equals_full_attention_except_self(bucket_size):
    q, k, v = _inputs(b=1, t=23)
    out = lsh_attention(q, k, v, n_hashes=2, bucket_size=bucket_size, causal=False,
                        generator_or_rotations=torch.Generator().manual_seed(3))
    expected = _dense_without_self(q, k, v, torch.ones(23, 23, dtype=torch.bool))
    assert_close("single chunk", expected, out, 1e-12)


def test_causal_single_round_is_softmax_over_earlier_keys_of_the_same_bucket():
    """Causal chunks never cross buckets (unlike sort-and-chunk); with one round and chunks
    longer than T a query sees exactly the earlier keys of its bucket."""
    q, k, v = _inputs(b=1, t=23)
    rotations = draw_rotations(1, 8, 4, dtype=F64)
    out = lsh_attention(q, k, v, n_hashes=1, bucket_size=32, causal=True,
                        generator_or_rotations=rotations)
    buckets = hash_buckets(F.normalize(k, dim=-1), rotations)[:, :, 0]  # [1, H, T]
    same = buckets.unsqueeze(-1) == buckets.unsqueeze(-2)
    allowed = same & torch.ones(23, 23, dtype=torch.bool).tril()
    assert not same.all()  # several buckets, so this differs from full causal attention
    assert_close("causal single chunk", _dense_without_self(q, k, v, allowed), out, 1e-12)
    assert torch.equal(out[:, :, 0], v[:, :, 0])  # self only as the last resort


@pytest.mark.parametrize("causal", [True, False])
def test_padded_tokens_do_not_influence_real_outputs(causal):
    q, k, v = (x.detach() for x in _inputs(b=1, t=30))
    pad = torch.ones(1, 30, dtype=torch.bool)
    pad[0, [2, 9, 10, 29]] = False
    kw = dict(n_hashes=2, bucket_size=4, causal=causal,
              generator_or_rotations=draw_rotations(2, 8, 4, dtype=F64), key_padding_mask=pad)
    out = lsh_attention(q, k, v, **kw)
    # new padded queries and keys (so new hashes, which would move chunk boundaries if padding
    # shared the real buckets) and huge padded values
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[..., ~pad[0], :] = torch.randn_like(q2[..., ~pad[0], :])
    k2[..., ~pad[0], :] = torch.randn_like(k2[..., ~pad[0], :])
    v2[..., ~pad[0], :] = 1e6
    out2 = lsh_attention(q2, k2, v2, **kw)
    assert torch.equal(out[..., pad[0], :], out2[..., pad[0], :])
    if causal:  # a padded query sees only padded keys
        assert torch.equal(out[..., ~pad[0], :], torch.zeros_like(out[..., ~pad[0], :]))
    buckets = hash_buckets(F.normalize(k, dim=-1), kw["generator_or_rotations"], pad)
    assert (buckets[..., ~pad[0]] == 4).all() and (buckets[..., pad[0]] < 4).all()


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


def test_causal_slot_layout_structure():
    t, n_buckets, size = 50, 4, 4
    buckets = torch.randint(0, n_buckets, (2, 3, t))
    buckets[0, 0] = 1  # one bucket holds everything
    slot_pos, slot_of = causal_slot_layout(buckets, n_buckets, size)
    assert slot_pos.shape == (2, 3, causal_slot_count(t, n_buckets, size))
    assert slot_pos.shape[-1] <= t + n_buckets * size
    positions = torch.arange(t).expand_as(buckets)
    assert torch.equal(slot_pos.gather(-1, slot_of), positions)  # slot_of inverts slot_pos
    assert ((slot_pos >= 0).sum(-1) == t).all()  # every position once, the rest empty
    # each chunk holds one bucket in increasing position order, starting at a rank multiple
    chunks = slot_pos.view(2, 3, -1, size)
    filled = chunks >= 0
    chunk_buckets = buckets.gather(-1, chunks.clamp(min=0).flatten(2)).view(chunks.shape)
    first = chunk_buckets[..., :1]
    assert ((chunk_buckets == first) | ~filled).all()
    assert (filled[..., :-1] | ~filled[..., 1:]).all()  # empty slots only at a chunk's end
    assert ((chunks.diff(dim=-1) > 0) | ~filled[..., 1:]).all()
    # the dense definition agrees: pairs allowed across a chunk boundary are previous-chunk
    mask = causal_pair_mask(buckets[:, :, None], size)[:, :, 0]  # [2, 3, T, T]
    chunk_of = slot_of // size
    gap = chunk_of.unsqueeze(-1) - chunk_of.unsqueeze(-2)
    assert ((gap == 0) | (gap == 1))[mask].all()
    assert (gap == 1)[mask].any() and mask[0, 0].sum(-1).max() == 2 * size


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
    with pytest.raises(ValueError, match="needs Tq == Tk"):
        lsh_attention(q[:, :, 1:], k, v, n_hashes=1, bucket_size=8, causal=False)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        lsh_attention(q, k[:, :, 1:], v[:, :, 1:], n_hashes=1, bucket_size=8, causal=True)
