import math

import pytest
import torch

from attnlab.config import ConfigError, PartSpec
from attnlab.layers import MLPS, MLPContext
from attnlab.layers.sigma_moe import ENTROPY_KEY, SigmaMoE, SigmaMoEOptions, selection_entropy_gap
from attnlab.models import DecoderLM, ModelConfig

D = 12


def make_moe(d_ff=64, dropout=0.0, **options):
    ctx = MLPContext(d_model=D, d_ff=d_ff, dropout=dropout, layer_idx=0, n_layers=2,
                     init_scale=1.0)
    opts = SigmaMoEOptions(**{"n_experts": 6, "expert_size": 5, "k": 2, **options})
    opts.validate()
    return SigmaMoE(ctx, opts).double()


def reference(moe, x):
    """Per-token loop: y = sum over the top-k sigmoid-gated experts of W2_e relu(W1_e x)."""
    rows = x.reshape(-1, D)
    out = []
    for xt in rows:
        scores = torch.sigmoid(moe.sel @ xt)
        top = torch.topk(scores, moe.opts.k).indices.tolist()
        out.append(sum(scores[e] * (torch.relu(xt @ moe.up[e]) @ moe.down[e]) for e in top))
    return torch.stack(out).view(x.shape)


def test_matches_loop_reference_forward_and_gradients():
    moe = make_moe().eval()
    x = torch.randn(3, 4, D, dtype=torch.float64, requires_grad=True)
    y, aux = moe(x)
    expected = reference(moe, x)
    assert aux == {}  # the regulariser is a training term
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(y)
    inputs = [x, *moe.parameters()]
    got = torch.autograd.grad((w * y).sum(), inputs)
    want = torch.autograd.grad((w * expected).sum(), inputs)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    assert got[3].abs().sum() > 0  # the selection matrix learns through the gates


def test_entropy_regulariser_is_weighted_finite_and_differentiable():
    moe = make_moe(entropy_reg=0.01).train()
    x = torch.randn(4, 8, D, dtype=torch.float64)
    _, aux = moe(x)
    value = aux[ENTROPY_KEY]
    assert torch.isfinite(value) and value.item() > 0
    logits = x.reshape(-1, D) @ moe.sel.T
    p = torch.softmax(logits, -1).mean(0)
    entropy = -(p * p.log()).sum()
    torch.testing.assert_close(value, 0.01 * (math.log(6) - entropy))
    value.backward()
    assert moe.sel.grad.abs().sum() > 0


def test_entropy_gap_is_zero_for_uniform_selection():
    assert selection_entropy_gap(torch.zeros(5, 4)).abs().item() < 1e-6
    peaked = torch.tensor([[30.0, 0, 0, 0]]).expand(5, 4)
    assert selection_entropy_gap(peaked).item() == pytest.approx(math.log(4), abs=1e-3)


def test_expert_without_tokens_gets_no_gradient_and_dropout_is_training_only():
    moe = make_moe(expert_dropout=0.5)
    with torch.no_grad():
        moe.sel[2] = -10.0
    x = torch.ones(2, 6, D, dtype=torch.float64) + 0.1 * torch.randn(2, 6, D, dtype=torch.float64)
    moe.eval()
    y, _ = moe(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and moe.up.grad[2].abs().max() == 0
    torch.testing.assert_close(moe(x)[0], y, rtol=0, atol=0)  # eval: deterministic
    moe.train()
    assert not torch.equal(moe(x)[0], y)


def test_expert_size_from_d_ff_and_validation():
    assert make_moe(d_ff=60, expert_size=None).up.shape == (6, D, 10)
    with pytest.raises(ValueError, match="not divisible by n_experts=6"):
        make_moe(d_ff=64, expert_size=None)
    ctx = MLPContext(D, 64, 0.0, 0, 1, 1.0)
    for options, match in [({"k": 7}, "k must be in"), ({"activation": "tanh"}, "activation"),
                           ({"entropy_reg": -1.0}, "entropy_reg"),
                           ({"expert_dropout": 1.0}, "expert_dropout")]:
        with pytest.raises(ConfigError, match=match):
            MLPS.build(PartSpec("sigma_moe", {"n_experts": 6, **options}), ctx=ctx)


def test_decoder_lm_trains_with_sigma_moe_and_switchhead():
    import attnlab.layers.switchhead  # noqa: F401  (registers "switchhead")

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, d_model=32, n_layers=2, d_ff=64, max_seq_len=32,
                      attention={"n_heads": 2, "d_head": 8,
                                 "projections": {"name": "switchhead", "n_experts": 4, "k": 2}},
                      mlp={"name": "sigma_moe", "n_experts": 8, "expert_size": 16, "k": 2,
                           "entropy_reg": 1e-3})
    model = DecoderLM(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 32, (8, 17))
    losses = []
    for _ in range(15):
        out = model(ids[:, :-1], targets=ids[:, 1:])
        assert set(out.aux) == {ENTROPY_KEY} and torch.isfinite(out.aux_loss)
        opt.zero_grad()
        (out.loss + out.aux_loss).backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0] - 0.5
