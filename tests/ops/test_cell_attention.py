"""Attention over per-row cells (one head's run of keys each): fast path vs dense reference."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention import softmax_attention
from attnlab.ops.sparse_attention import cell_attention, cell_attention_naive, cell_mask
from attnlab.utils.testing import assert_close, assert_grads_close

F64 = torch.float64


def _qkv(b, h, hk, t, d=8, dv=5, dtype=F64):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, t, d, dtype=dtype, generator=gen).requires_grad_()
    k = torch.randn(b, hk, t, d, dtype=dtype, generator=gen).requires_grad_()
    v = torch.randn(b, hk, t, dv, dtype=dtype, generator=gen).requires_grad_()
    return q, k, v


def _random_cells(b, h, t, c, w, seed=1):
    """Each row: ``c`` cells on random heads, each a run of up to ``w`` distinct keys; the
    runs of one (row, head) do not overlap. Row 3 has no valid key at all."""
    gen = torch.Generator().manual_seed(seed)
    head = torch.randint(0, h, (b, t, c), generator=gen)
    # disjoint runs: cell j starts at j * w (mod t) shifted by a per-row offset
    start = (torch.arange(c) * w)[None, None] + torch.randint(0, t, (b, t, 1), generator=gen)
    index = (start[..., None] + torch.arange(w)) % t
    valid = torch.rand(b, t, c, w, generator=gen) < 0.8
    valid[:, 3] = False
    return head, index, valid


@pytest.mark.parametrize("hk", [4, 2, 1])
@pytest.mark.parametrize("with_row_scale", [True, False])
def test_fast_matches_naive_forward_and_gradients(hk, with_row_scale):
    q, k, v = _qkv(2, 4, hk, 20)
    head, index, valid = _random_cells(2, 4, 20, c=3, w=4)
    row_scale = torch.rand(2, 4, 20, dtype=F64).requires_grad_() if with_row_scale else None
    out = cell_attention(q, k, v, head, index, valid, scale=0.3, row_scale=row_scale,
                         query_chunk=6)
    ref = cell_attention_naive(q, k, v, head, index, valid, scale=0.3, row_scale=row_scale)
    assert_close("out", ref, out, 1e-12)
    inputs = [x for x in (q, k, v, row_scale) if x is not None]
    assert_grads_close(ref, out, inputs, "qkvr"[: len(inputs)], 1e-11)
    # heads without cells in a row output exactly zero; so does the row with no valid key
    mask = cell_mask(head, index, valid, 4, 20)
    assert (out.detach()[~mask.any(-1)] == 0).all() and (out.detach()[:, :, 3] == 0).all()


def test_cells_of_one_head_share_one_softmax():
    """A head's keys split over several cells give the same result as one cell."""
    q, k, v = _qkv(1, 2, 2, 12)
    keys = torch.tensor([0, 2, 5, 7, 8, 11])
    one = cell_attention(q, k, v, torch.zeros(1, 12, 1, dtype=torch.long),
                         keys.expand(1, 12, 1, 6), torch.ones(1, 12, 1, 6, dtype=torch.bool),
                         scale=0.5)
    split = cell_attention(q, k, v, torch.zeros(1, 12, 3, dtype=torch.long),
                           keys.view(3, 2).expand(1, 12, 3, 2),
                           torch.ones(1, 12, 3, 2, dtype=torch.bool), scale=0.5)
    assert_close("split", one, split, 1e-12)


def test_cells_covering_the_causal_prefix_equal_causal_attention():
    b, h, t = 1, 3, 9
    q, k, v = _qkv(b, h, h, t)
    head = torch.arange(h).expand(b, t, h)
    index = torch.arange(t).expand(b, t, h, t)
    valid = index <= torch.arange(t).view(1, t, 1, 1)
    out = cell_attention(q, k, v, head, index, valid, scale=0.4)
    assert_close("causal", softmax_attention(q, k, v, scale=0.4, causal=True), out, 1e-12)


def test_a_score_bias_is_added_at_the_cells_keys():
    """Cells covering each row's causal prefix with a bias fn(b, h, i, j) equal causal
    attention with the dense bias, forward and gradients (the bias's parameter included),
    in several query chunks."""
    b, h, t = 2, 3, 11
    q, k, v = _qkv(b, h, h, t)
    table = torch.randn(b, h, t, dtype=F64, requires_grad=True)

    def fn(bi, hi, i, j):
        return table[bi, hi, j] - 0.2 * (hi + 1) * (i - j)

    head = torch.arange(h).expand(b, t, h)
    index = torch.arange(t).expand(b, t, h, t)
    valid = index <= torch.arange(t).view(1, t, 1, 1)
    out = cell_attention(q, k, v, head, index, valid, scale=0.4, score_bias=fn, query_chunk=4)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    dense = fn(torch.arange(b).view(b, 1, 1, 1), torch.arange(h).view(1, h, 1, 1), i, j)
    ref = softmax_attention(q, k, v, scale=0.4, causal=True, score_bias=dense)
    assert_close("biased", ref, out, 1e-12)
    assert_grads_close(ref, out, (q, k, v, table), "qkvb", 1e-11)
    naive = cell_attention_naive(q, k, v, head, index, valid, scale=0.4, score_bias=fn)
    assert_close("naive", ref, naive, 1e-12)


@pytest.mark.parametrize("activation", ["softmax1", "sigmoid"])
def test_score_activations_over_cells_equal_dense_attention(activation):
    """Each head's causal prefix split over two cells (so softmax1's normaliser spans cells)
    equals dense causal attention under the activation, forward and gradients; so does the
    reference."""
    b, h, t = 2, 3, 10
    q, k, v = _qkv(b, h, h, t)
    head = torch.arange(h).repeat_interleave(2).expand(b, t, 2 * h)
    half = torch.arange(t // 2)
    index = torch.stack([half, half + t // 2]).repeat(h, 1).expand(b, t, 2 * h, t // 2)
    valid = index <= torch.arange(t).view(1, t, 1, 1)
    kw = dict(scale=0.4, activation=activation, sigmoid_bias=-1.5)
    out = cell_attention(q, k, v, head, index, valid, query_chunk=3, **kw)
    ref = softmax_attention(q, k, v, causal=True, **kw)
    assert_close(activation, ref, out, 1e-12)
    assert_grads_close(ref, out, (q, k, v), "qkv", 1e-11)
    assert_close("naive", ref, cell_attention_naive(q, k, v, head, index, valid, **kw), 1e-12)
    with pytest.raises(ValueError, match="unknown score activation"):
        cell_attention(q, k, v, head, index, valid, scale=0.4, activation="relu")


def test_low_precision_inputs_compute_in_float32():
    q, k, v = (x.detach().to(torch.bfloat16) for x in _qkv(1, 2, 2, 16))
    head, index, valid = _random_cells(1, 2, 16, c=2, w=4)
    out = cell_attention(q, k, v, head, index, valid, scale=0.3)
    ref = cell_attention_naive(q.double(), k.double(), v.double(), head, index, valid, scale=0.3)
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).abs().max() < 0.05


@pytest.mark.parametrize(("change", "match"), [
    ({"head": "too_big"}, "cell_head must lie"),
    ({"index": "too_big"}, "key_index of valid slots"),
    ({"index": "float"}, "integer"),
    ({"valid": "int"}, "bool"),
    ({"index": "short"}, r"key_index must be \[B, Tq, C, W\]"),
    ({"row_scale": "bad"}, "row_scale must be"),
])
def test_validation_errors(change, match):
    q, k, v = (x.detach() for x in _qkv(1, 2, 2, 6))
    head, index, valid = _random_cells(1, 2, 6, c=2, w=2)
    row_scale = None
    if change.get("head") == "too_big":
        head = head + 2
    if change.get("index") == "too_big":
        index = index + 6
    if change.get("index") == "float":
        index = index.double()
    if change.get("index") == "short":
        index, valid = index[:, :, :1], valid[:, :, :1]
    if change.get("valid") == "int":
        valid = valid.long()
    if change.get("row_scale") == "bad":
        row_scale = torch.ones(1, 2, 5, dtype=F64)
    with pytest.raises(ValueError, match=match):
        cell_attention(q, k, v, head, index, valid, scale=0.3, row_scale=row_scale)


def test_fast_path_never_allocates_a_t_by_t_tensor_and_does_not_keep_the_gathers():
    from tests.ops.test_sparse_attention import _LargestTensor

    t, h, c, w, d = 4096, 2, 2, 32, 16
    q, k, v = (torch.randn(1, h, t, d, requires_grad=True) for _ in range(3))
    head = (torch.arange(c) % h).expand(1, t, c)  # one cell per head
    start = torch.arange(t).view(1, t, 1, 1) - w + 1
    index = (start + torch.arange(w)).expand(1, t, c, w)  # a causal window of w keys
    valid = index >= 0
    index = index.clamp_min(0)
    saved = []
    with _LargestTensor() as probe, torch.autograd.graph.saved_tensors_hooks(
        lambda x: saved.append(x.numel() * x.element_size()) or x, lambda x: x
    ):
        cell_attention(q, k, v, head, index, valid, scale=0.25).sum().backward()
    assert probe.largest < 4 * t * t // 8, probe.largest  # far below one fp32 T x T matrix
    gathers = 2 * t * c * w * d * 4  # every chunk's gathered K and V, fp32
    assert sum(saved) < gathers / 2, (sum(saved), gathers)
