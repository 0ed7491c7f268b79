"""Sink + sliding-window attention: which keys a row reads, causality, refusals, the cache
columns and the decoding rows' native path (the fast paths against the dense reference:
test_contract)."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention import window as window_module
from attnlab.ops.attention.window import (
    window_attention,
    window_attention_naive,
    window_cache_columns,
)
from attnlab.ops.sparse_attention import native
from attnlab.utils.testing import assert_close

F64 = torch.float64


def _qkv(b=2, h=4, hk=2, t_q=37, t_k=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t_q, 8, generator=gen, dtype=F64)
    k, v = (torch.randn(b, hk, t_k, 8, generator=gen, dtype=F64) for _ in range(2))
    return q, k, v


def test_a_row_attends_to_its_sinks_and_its_window_only():
    """With v the one-hot of each key's position, the output weights show which keys a row
    reads: row 10 with 2 sinks and a window of 3 reads keys 0, 1, 8, 9, 10."""
    t = 12
    q = torch.zeros(1, 1, t, 4, dtype=F64)  # equal scores: uniform over the allowed keys
    k = torch.randn(1, 1, t, 4, dtype=F64)
    v = torch.eye(t, dtype=F64)[None, None]
    out = window_attention(q, k, v, scale=1.0, sinks=2, window=3)
    assert out[0, 0, 10].nonzero().flatten().tolist() == [0, 1, 8, 9, 10]
    torch.testing.assert_close(out[0, 0, 10].sum(), torch.tensor(1.0, dtype=F64))
    assert out[0, 0, 1].nonzero().flatten().tolist() == [0, 1]  # causal


def test_future_keys_do_not_change_the_past():
    q, k, v = _qkv()
    out = window_attention(q, k, v, scale=0.3, sinks=2, window=5)
    k2, v2 = k.clone(), v.clone()
    k2[..., 20:, :] += 3.0
    v2[..., 20:, :] -= 2.0
    changed = window_attention(q, k2, v2, scale=0.3, sinks=2, window=5)
    torch.testing.assert_close(changed[..., :20, :], out[..., :20, :], rtol=0, atol=0)


def test_bad_sizes_are_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="window must be >= 1"):
        window_attention(q, k, v, scale=0.3, sinks=2, window=0)
    with pytest.raises(ValueError, match="sinks must be >= 0"):
        window_attention_naive(q, k, v, scale=0.3, sinks=-1, window=4)


def test_cache_columns_are_the_sinks_and_the_last_window_minus_one_keys():
    assert window_cache_columns(None, 10, sinks=2, window=4).tolist() == [0, 1, 7, 8, 9]
    assert window_cache_columns(None, 10, sinks=0, window=1).tolist() == []
    assert window_cache_columns(None, 5, sinks=2, window=4).tolist() == [0, 1, 2, 3, 4]
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, :3] = False  # left padding: row 0's sinks are columns 3, 4
    mask[1, 8:10] = False  # a hole: row 1's last 3 real keys are columns 7, 10, 11
    kept = window_cache_columns(mask, 12, sinks=2, window=4)
    assert kept.tolist() == [0, 1, 2, 3, 4, 7, 8, 9, 10, 11]


@pytest.mark.parametrize(("sinks", "window"), [(0, 1), (2, 5), (3, 9), (1, 40)])
@pytest.mark.parametrize("t_new", [1, 4])
def test_later_queries_read_the_same_from_the_kept_keys(sinks, window, t_new):
    """Queries after a cache give the same outputs from its kept columns (and the later keys)
    as from all of them, with left padding and holes."""
    q, k, v = _qkv(t_q=t_new, t_k=37, seed=3)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[0, 12:20] = False
    mask[1, :9] = False
    kept = window_cache_columns(mask[:, :-t_new], 37 - t_new, sinks=sinks, window=window)
    columns = torch.cat((kept, torch.arange(37 - t_new, 37)))
    kw = dict(scale=0.3, sinks=sinks, window=window)
    full = window_attention(q, k, v, key_padding_mask=mask, **kw)
    trimmed = window_attention(q, k[..., columns, :], v[..., columns, :],
                               key_padding_mask=mask[:, columns], **kw)
    assert_close("window from kept keys", full, trimmed, 1e-13)


@pytest.mark.skipif(not native.available(), reason="the native kernel is not built")
def test_decoding_rows_under_padding_read_their_own_window_natively(monkeypatch):
    """Batch 8, each row left-padded differently, one new token: each row's sinks and window
    go to the run kernel (not the union of the batch's windows) and equal the reference."""
    calls = []
    runs = window_module.run_attention
    monkeypatch.setattr(window_module, "run_attention",
                        lambda *a, **kw: calls.append(a[3].shape) or runs(*a, **kw))
    q, k, v = (x.float() for x in _qkv(b=8, t_q=1, t_k=60))
    mask = torch.arange(60)[None] >= torch.arange(0, 40, 5)[:, None]  # 0..35 padding keys
    with torch.no_grad():
        out = window_attention(q, k, v, scale=0.3, sinks=2, window=7, key_padding_mask=mask)
    assert calls == [(8, 1, 2 * 4)]  # two runs per query head
    ref = window_attention_naive(q.double(), k.double(), v.double(), scale=0.3, sinks=2,
                                 window=7, key_padding_mask=mask)
    assert_close("window runs", ref, out.double(), 1e-5)

