"""Performer / FAVOR+ linear attention: decoding, causality, padding, precision, feature maps
(the fast path against the explicit reference: test_contract)."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention import softmax_attention
from attnlab.ops.performer import (
    orthogonal_gaussian,
    performer_attention,
    performer_attention_weights,
    relu_features,
    softmax_features,
)
from attnlab.utils.testing import assert_close, rel_rms_error

F64 = torch.float64
KERNELS = ["softmax", "relu"]


def _qkv(b=2, h=4, hk=2, t=45, d=8, dv=6, dtype=F64):
    q = torch.randn(b, h, t, d, dtype=dtype)
    k = torch.randn(b, hk, t, d, dtype=dtype)
    v = torch.randn(b, hk, t, dv, dtype=dtype)
    return [q, k, v]


@pytest.mark.parametrize("kernel", KERNELS)
def test_incremental_decoding_equals_full_pass(kernel):
    q, k, v = _qkv(t=30)
    proj = orthogonal_gaussian(16, 8, dtype=F64)
    full = performer_attention(q, k, v, proj, kernel=kernel, causal=True, chunk_size=8)
    for splits in ([1] * 30, [7, 1, 13, 9]):
        state, outs, start = None, [], 0
        for n in splits:
            sl = slice(start, start + n)
            out, state = performer_attention(
                q[:, :, sl], k[:, :, sl], v[:, :, sl], proj, kernel=kernel, causal=True,
                chunk_size=8, state=state, return_state=True,
            )
            outs.append(out)
            start += n
        assert_close(f"decode {splits[:3]}", full, torch.cat(outs, dim=2), 1e-12)
    assert state.kv.shape == (2, 2, 16, 6) and state.k_sum.shape == (2, 2, 16)


@pytest.mark.parametrize("kernel", KERNELS)
def test_causal_outputs_ignore_future_tokens_exactly(kernel):
    q, k, v = _qkv(t=40, dtype=torch.float32)
    proj = orthogonal_gaussian(16, 8)
    t0 = 21  # inside the second chunk: exercises both the in-chunk mask and the carried state
    out = performer_attention(q, k, v, proj, kernel=kernel, causal=True, chunk_size=16)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    # much larger future keys would move a global key stabiliser; the running one must not care
    q2[:, :, t0:] = 5 * torch.randn_like(q2[:, :, t0:])
    k2[:, :, t0:] = 5 * torch.randn_like(k2[:, :, t0:])
    v2[:, :, t0:] = 1e3 * torch.randn_like(v2[:, :, t0:])
    out2 = performer_attention(q2, k2, v2, proj, kernel=kernel, causal=True, chunk_size=16)
    assert torch.equal(out[:, :, :t0], out2[:, :, :t0])
    assert not torch.equal(out[:, :, t0:], out2[:, :, t0:])


@pytest.mark.parametrize("causal", [True, False])
def test_softmax_kernel_approximates_softmax_attention(causal):
    q, k, v = (0.5 * x for x in _qkv(b=1, h=2, hk=2, t=64, d=16, dv=16))
    exact = softmax_attention(q, k, v, scale=16**-0.5, causal=causal)

    def error(m: int) -> float:  # mean over independent feature draws
        errs = []
        for seed in range(3):
            proj = orthogonal_gaussian(m, 16, generator=torch.Generator().manual_seed(seed))
            out = performer_attention(q, k, v, proj.to(F64), causal=causal)
            errs.append(rel_rms_error(exact, out))
        return sum(errs) / len(errs)

    coarse, fine = error(64), error(4096)
    assert fine < 0.1, fine
    assert fine < 0.5 * coarse, (coarse, fine)


@pytest.mark.parametrize("causal", [True, False])
def test_padded_keys_contribute_nothing(causal):
    q, k, v = _qkv(b=1, h=2, hk=2, t=20)
    proj = orthogonal_gaussian(16, 8, dtype=F64)
    pad = torch.ones(1, 20, dtype=torch.bool)
    pad[0, [0, 3, 4, 11, 19]] = False
    out = performer_attention(q, k, v, proj, causal=causal, key_padding_mask=pad, chunk_size=8)
    k2, v2 = k.clone(), v.clone()
    k2[..., ~pad[0], :] = 10.0  # huge garbage at padded keys: ignored, also by the stabiliser
    v2[..., ~pad[0], :] = 1e6
    out2 = performer_attention(q, k2, v2, proj, causal=causal, key_padding_mask=pad, chunk_size=8)
    assert_close("padded garbage", out, out2, 1e-12)
    if not causal:  # same as dropping the padded keys altogether
        keep = pad[0]
        dropped = performer_attention(q, k[..., keep, :], v[..., keep, :], proj, causal=False)
        assert_close("dropped", dropped, out, 1e-12)
    else:  # query 0 sees only padding: exact zeros, not NaN
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
def test_low_precision_inputs_compute_in_float32(dtype, causal):
    q, k, v = (x.to(dtype) for x in _qkv(t=33, dtype=torch.float32))
    proj = orthogonal_gaussian(32, 8)
    out = performer_attention(q, k, v, proj, causal=causal, chunk_size=16)
    assert out.dtype == dtype
    ref = performer_attention(q.float(), k.float(), v.float(), proj, causal=causal, chunk_size=16)
    assert_close("low precision", ref, out.float(), 1e-2)
    # large inputs: float32 compute plus the stabilisers keep every exp finite
    big = performer_attention(8 * q, 8 * k, v, proj, causal=causal, chunk_size=16)
    assert torch.isfinite(big).all()


def test_orthogonal_gaussian_blocks_and_norms():
    gen = torch.Generator().manual_seed(1)
    w = orthogonal_gaussian(40, 16, generator=gen, dtype=F64)  # 2 full blocks + 8 rows
    assert w.shape == (40, 16)
    for block in (w[:16], w[16:32], w[32:]):
        unit = block / block.norm(dim=-1, keepdim=True)
        assert torch.allclose(unit @ unit.T, torch.eye(len(block), dtype=F64), atol=1e-12)
    assert torch.equal(w, orthogonal_gaussian(40, 16, generator=torch.Generator().manual_seed(1),
                                              dtype=F64))
    lengths = orthogonal_gaussian(4096, 16, dtype=F64).norm(dim=-1)
    # chi(16): mean ~ 3.94, variance ~ 0.48
    assert abs(lengths.mean().item() - 3.94) < 0.1
    assert abs(lengths.var().item() - 0.48) < 0.1


def test_feature_maps_shapes_and_estimator():
    x = 0.3 * torch.randn(3, 5, 8, dtype=F64)
    y = 0.3 * torch.randn(3, 7, 8, dtype=F64)
    proj = orthogonal_gaussian(8192, 8, dtype=F64)
    fq, fk = softmax_features(x, proj, is_query=True), softmax_features(y, proj, is_query=False)
    assert fq.shape == (3, 5, 8192) and (fq > 0).all() and (fk > 0).all()
    # normalised rows of phi(q) phi(k)^T estimate softmax(q k^T): the stabilisers cancel
    est = fq @ fk.transpose(-1, -2)
    est = est / est.sum(-1, keepdim=True)
    assert_close("kernel", torch.softmax(x @ y.transpose(-1, -2), -1), est, 0.05)
    relu = relu_features(x, proj[:16])
    assert relu.shape == (3, 5, 16) and (relu >= 1e-3).all()


def test_argument_errors():
    q, k, v = _qkv()
    proj = orthogonal_gaussian(8, 8, dtype=F64)
    with pytest.raises(ValueError, match="kernel"):
        performer_attention(q, k, v, proj, kernel="cosine", causal=True)
    with pytest.raises(ValueError, match="causal"):
        performer_attention(q, k, v, proj, causal=False, return_state=True)
    with pytest.raises(ValueError, match="Tq == Tk"):
        performer_attention(q[:, :, :5], k, v, proj, causal=True)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_weights_are_the_matrix_the_fast_path_applies(kernel, causal):
    q, k, v = _qkv()
    proj = orthogonal_gaussian(24, 8, dtype=F64)
    pad = torch.rand(2, 45) > 0.2
    kw = dict(kernel=kernel, causal=causal, scale=0.4, key_padding_mask=pad)
    weights = performer_attention_weights(q, k, proj, **kw)
    assert weights.shape == (2, 4, 45, 45)
    out = performer_attention(q, k, v, proj, chunk_size=16, **kw)
    assert_close("weights @ v", out, weights @ v.repeat_interleave(2, dim=1), 1e-12)
    assert (weights >= 0).all() and (weights[0][..., ~pad[0]] == 0).all()  # padded keys
    visible = weights.sum(-1) > 0
    torch.testing.assert_close(weights.sum(-1)[visible], torch.ones_like(weights.sum(-1)[visible]))
    if causal:
        assert (weights.triu(1) == 0).all()
