"""Score activations (softmax, softmax1, sigmoid): formulas, stability, masks, and the SDPA
path after a cache offset (against the explicit reference on every combination of options:
test_contract)."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention import sdpa_attention, softmax_attention
from attnlab.ops.attention.activations import ACTIVATIONS, attention_weights

F64 = torch.float64


def qkv(t=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, t, 8, generator=gen, dtype=F64) for _ in range(3)]


def test_formulas():
    x = torch.randn(3, 5, dtype=F64)
    torch.testing.assert_close(attention_weights(x, None, "softmax"), torch.softmax(x, -1))
    torch.testing.assert_close(attention_weights(x, None, "softmax1"),
                               x.exp() / (1 + x.exp().sum(-1, keepdim=True)))
    torch.testing.assert_close(attention_weights(x, None, "sigmoid", -2.0), torch.sigmoid(x - 2))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_masked_keys_and_empty_rows_get_zero_weight(activation):
    x = torch.randn(2, 4, dtype=F64)
    mask = torch.tensor([[True, False, True, False], [False] * 4])
    w = attention_weights(x, mask, activation)
    assert (w[~mask] == 0).all() and w[0, mask[0]].gt(0).all()


def test_softmax1_is_stable_and_can_attend_to_nothing():
    huge = torch.tensor([[1e4, 1e4 - 1.0]], dtype=torch.float32)
    w = attention_weights(huge, None, "softmax1")
    torch.testing.assert_close(w, torch.softmax(huge, -1))  # the extra 1 is negligible
    tiny = torch.full((1, 3), -1e4)
    assert attention_weights(tiny, None, "softmax1").abs().max() == 0  # rows may sum to ~0


def test_a_query_after_a_cache_offset_sees_its_keys():
    q, k, v = qkv(t=7)
    out = sdpa_attention(q[..., -2:, :], k, v, scale=0.3, causal=True, activation="softmax1")
    ref = softmax_attention(q, k, v, scale=0.3, causal=True, activation="softmax1")[..., -2:, :]
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_unknown_activation_names_the_choices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"unknown score activation 'relu'; choose one of"):
        sdpa_attention(q, k, v, scale=1.0, causal=True, activation="relu")
