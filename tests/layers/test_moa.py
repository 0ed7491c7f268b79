import pytest
import torch

import attnlab.layers.moa  # noqa: F401  (registers "moa")
from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.layers.moa import MoAOptions, MoAProjections

D_MODEL, N_HEADS, D_HEAD, E = 16, 3, 8, 6


def make_ctx():
    return LayerContext(d_model=D_MODEL, n_heads=N_HEADS, d_head=D_HEAD, causal=True,
                        max_seq_len=64, layer_idx=0, n_layers=2, init_scale=1.0)


def reference(part, x, o_in):
    """Per-token loop: softmax router, top-H experts, renormalised gates; returns q, k, v, y."""
    b, t, _ = x.shape
    q = torch.zeros(b, N_HEADS, t, D_HEAD, dtype=x.dtype)
    y = torch.zeros(b, t, D_MODEL, dtype=x.dtype)
    for bi in range(b):
        for ti in range(t):
            xt = x[bi, ti]
            probs = torch.softmax(part.router @ xt, -1)
            top = torch.topk(probs, N_HEADS).indices
            gates = probs[top] / probs[top].sum()
            for h, (e, g) in enumerate(zip(top.tolist(), gates, strict=True)):
                q[bi, h, ti] = xt @ part.q_experts[e]
                y[bi, ti] += g * (o_in[bi, h, ti] @ part.o_experts[e])
    k = (x @ part.k_proj.weight.T)[:, None]
    v = (x @ part.v_proj.weight.T)[:, None]
    return q, k, v, y


def test_part_matches_loop_reference_forward_and_gradients():
    part = MoAProjections(make_ctx(), MoAOptions(n_experts=E)).double().eval()
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64, requires_grad=True)
    o_in = torch.randn(2, N_HEADS, 5, D_HEAD, dtype=torch.float64, requires_grad=True)
    p = part.project(x)
    y, _ = part.output(o_in, p)
    outs, expected = (p.q, p.k, p.v, y), reference(part, x, o_in)
    assert p.k.shape == (2, 1, 5, D_HEAD) and part.score_scale == D_HEAD**-0.5
    for got, want in zip(outs, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    weights = [torch.randn_like(t) for t in outs]
    inputs = [x, o_in, *part.parameters()]

    def grads(tensors):
        loss = sum((w * t).sum() for w, t in zip(weights, tensors, strict=True))
        return torch.autograd.grad(loss, inputs)

    got, want = grads(outs), grads(expected)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    assert got[2].abs().sum() > 0  # the router learns through the gates


def make_layer(positions="rope"):
    cfg = AttentionConfig(n_heads=N_HEADS, d_head=D_HEAD, positions=positions,
                          projections={"name": "moa", "n_experts": E})
    return Attention(make_ctx(), cfg).double().eval()


@pytest.mark.parametrize("positions", ["rope", {"name": "xl", "content_bias": False}, "none"],
                         ids=["rope", "xl", "none"])
def test_cached_decoding_equals_full_pass(positions):
    layer = make_layer(positions)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64)
    full = layer(x).hidden
    out = layer(x[:, :7], use_cache=True)
    pieces, cache = [out.hidden], out.cache
    for t in range(7, 11):
        out = layer(x[:, t:t + 1], cache=cache, use_cache=True)
        pieces.append(out.hidden)
        cache = out.cache
    assert cache.k.shape == (2, 1, 11, D_HEAD)
    assert (torch.cat(pieces, 1) - full).abs().max() < 1e-10


def test_aux_losses_are_weighted_finite_positive_and_training_only():
    layer = make_layer().train()
    x = torch.randn(4, 8, D_MODEL, dtype=torch.float64)
    aux = layer(x).aux
    assert set(aux) == {"moa_switch_loss", "moa_z_loss"}
    part = layer.projections
    logits = x.reshape(-1, D_MODEL) @ part.router.T
    probs = torch.softmax(logits, -1)
    chosen = torch.zeros_like(probs).scatter(1, probs.topk(N_HEADS, -1).indices, 1.0)
    switch = E * (chosen.mean(0) / N_HEADS * probs.mean(0)).sum()
    torch.testing.assert_close(aux["moa_switch_loss"], 0.01 * switch)
    torch.testing.assert_close(aux["moa_z_loss"], 0.001 * logits.logsumexp(-1).square().mean())
    for value in aux.values():
        assert torch.isfinite(value) and value.item() > 0
    sum(aux.values()).backward()
    assert part.router.grad.abs().sum() > 0
    assert layer.eval()(x).aux == {}


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="n_experts must be >= n_heads"):
        MoAProjections(make_ctx(), MoAOptions(n_experts=2))
    with pytest.raises(ConfigError, match="switch_loss must be >= 0"):
        AttentionConfig(projections={"name": "moa", "switch_loss": -1.0})
