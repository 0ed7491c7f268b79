import pytest
import torch

import attnlab.layers.switchhead  # noqa: F401  (registers "switchhead")
from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.layers.switchhead import SwitchHeadOptions, SwitchHeadProjections, select_experts
from attnlab.models import DecoderLM, ModelConfig
from attnlab.models.lm import Block

D_MODEL, N_HEADS, D_HEAD = 16, 2, 6


def make_ctx(**kw):
    base = dict(d_model=D_MODEL, n_heads=N_HEADS, d_head=D_HEAD, causal=True, max_seq_len=64,
                layer_idx=0, n_layers=2, init_scale=1.0)
    return LayerContext(**{**base, **kw})


def make_part(**options):
    opts = SwitchHeadOptions(**{"n_experts": 4, "k": 2, **options})
    opts.validate()
    return SwitchHeadProjections(make_ctx(), opts).double()


def ref_gate(logits, k, mode):
    top = torch.topk(logits, k).indices
    chosen = logits[top]
    return top, torch.sigmoid(chosen) if mode == "sigmoid" else torch.softmax(chosen, -1)


def ref_head_projection(part, name, xt, h):
    """One token's, one head's q/k/v by the paper's formula, written as a plain loop."""
    o, e, dh = part.opts, part.n_experts, part.d_head
    if not getattr(o, f"expert_{name}") or (name == "v" and e == 1):
        return getattr(part, f"{name}_proj").weight[h * dh:(h + 1) * dh] @ xt
    sel = {"q": part.sel_q if o.separate_kq_selection else part.sel_dst,
           "k": part.sel_k if o.separate_kq_selection else part.sel_src,
           "v": part.sel_dst if o.shared_selection else part.sel_src}[name]
    top, gate = ref_gate(sel[h * e:(h + 1) * e] @ xt, o.k, o.selection)
    weights = getattr(part, f"{name}_experts")
    return sum(g * (xt @ weights[h * e + i]) for i, g in zip(top.tolist(), gate, strict=True))


def reference(part, x, o_in):
    """q, k, v ``[B, H, T, D]`` of ``x`` and the output ``[B, T, d]`` of ``o_in``."""
    b, t, _ = x.shape
    h_, e, dh = part.n_heads, part.n_experts, part.d_head
    qkv = {n: torch.zeros(b, h_, t, dh, dtype=x.dtype) for n in "qkv"}
    y = torch.zeros(b, t, D_MODEL, dtype=x.dtype)
    for bi in range(b):
        for ti in range(t):
            xt = x[bi, ti]
            for h in range(h_):
                for n in "qkv":
                    qkv[n][bi, h, ti] = ref_head_projection(part, n, xt, h)
                oh = o_in[bi, h, ti]
                if part.opts.expert_o:
                    top, gate = ref_gate(part.sel_dst[h * e:(h + 1) * e] @ xt, part.opts.k,
                                         part.opts.selection)
                    for i, g in zip(top.tolist(), gate, strict=True):
                        y[bi, ti] += g * (oh @ part.o_experts[h * e + i])
                else:
                    y[bi, ti] += part.o_proj.weight[:, h * dh:(h + 1) * dh] @ oh
    scale = dh**-0.25
    return qkv["q"] * scale, qkv["k"] * scale, qkv["v"], y


CONFIGS = {
    "paper-VO": {},
    "shared-selection": {"shared_selection": True},
    "all-experts": {"expert_q": True, "expert_k": True},
    "separate-kq": {"expert_q": True, "expert_k": True, "separate_kq_selection": True},
    "O-only": {"expert_v": False},
    "dense": {"expert_v": False, "expert_o": False},
    "softmax": {"selection": "softmax", "k": 3},
    "one-expert": {"n_experts": 1, "k": 1},
}


@pytest.mark.parametrize("options", CONFIGS.values(), ids=CONFIGS.keys())
def test_part_matches_loop_reference_forward_and_gradients(options):
    part = make_part(**options)
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64, requires_grad=True)
    o_in = torch.randn(2, N_HEADS, 5, D_HEAD, dtype=torch.float64, requires_grad=True)
    p = part.project(x)
    y, aux = part.output(o_in, p)
    expected = reference(part, x, o_in)
    assert aux == {}
    for got, want in zip((p.q, p.k, p.v, y), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)

    weights = [torch.randn_like(t) for t in expected]
    inputs = [x, o_in, *part.parameters()]

    def grads(outs):
        loss = sum((w * t).sum() for w, t in zip(weights, outs, strict=True))
        return torch.autograd.grad(loss, inputs, allow_unused=True)

    for got, want in zip(grads((p.q, p.k, p.v, y)), grads(expected), strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_parameter_shapes_and_scaling():
    part = make_part()
    assert part.v_experts.shape == (N_HEADS * 4, D_MODEL, D_HEAD)
    assert part.o_experts.shape == (N_HEADS * 4, D_HEAD, D_MODEL)
    assert part.sel_src.shape == part.sel_dst.shape == (N_HEADS * 4, D_MODEL)
    assert part.score_scale == 1.0 and part.qk_prescale == pytest.approx(D_HEAD**-0.25)
    assert make_part(shared_selection=True).sel_src is None
    one = make_part(n_experts=1, k=1)
    assert not hasattr(one, "v_experts") and one.v_proj.out_features == N_HEADS * D_HEAD


def test_init_scales_and_renormalised_selection_rows():
    ctx = make_ctx(d_model=256, n_heads=4, d_head=32, init_scale=0.5)
    part = SwitchHeadProjections(ctx, SwitchHeadOptions(n_experts=8, k=2))
    assert part.v_experts.std().item() == pytest.approx(0.5 / 256**0.5, rel=0.03)
    assert part.o_experts.std().item() == pytest.approx(0.5 / (4 * 32) ** 0.5, rel=0.03)
    norms = part.sel_src.norm(dim=-1)
    torch.testing.assert_close(norms, norms[:1].expand_as(norms))
    assert part.sel_src.std().item() == pytest.approx(0.5 / 256**0.5, rel=0.03)


def test_expert_without_tokens_gets_no_gradient():
    part = make_part()
    with torch.no_grad():
        part.sel_src[1] = -10.0  # head 0, expert 1: lowest logit for every positive x
    x = torch.ones(2, 5, D_MODEL, dtype=torch.float64) + 0.1 * torch.randn(
        2, 5, D_MODEL, dtype=torch.float64)
    p = part.project(x)
    y, _ = part.output(torch.randn(2, N_HEADS, 5, D_HEAD, dtype=torch.float64), p)
    (p.v.sum() + y.sum()).backward()
    assert torch.isfinite(y).all()
    assert part.v_experts.grad[1].abs().max() == 0  # never chosen
    assert part.v_experts.grad.abs().sum(dim=(1, 2)).count_nonzero() >= N_HEADS * 2


def test_expert_dropout_only_in_training_and_gates_not_rescaled():
    part = make_part(n_experts=8, expert_dropout=0.7)
    plain = make_part(n_experts=8)
    plain.load_state_dict(part.state_dict())
    x = torch.randn(4, 16, D_MODEL, dtype=torch.float64)
    part.eval()
    plain.eval()
    torch.testing.assert_close(part.project(x).v, plain.project(x).v, rtol=0, atol=0)
    part.train()
    chosen = part.expert_choices(x)["o"]
    reference = plain.expert_choices(x)["o"]
    assert not torch.equal(chosen.index.sort(-1).values, reference.index.sort(-1).values)
    logits = (x @ part.sel_dst.T).view(4, 16, N_HEADS, 8)
    torch.testing.assert_close(chosen.gate, torch.sigmoid(logits.gather(-1, chosen.index)))


@pytest.mark.parametrize("shared", [False, True])
def test_expert_choices_are_the_experts_the_projections_use(shared):
    part = make_part(n_experts=6, k=2, shared_selection=shared).eval()
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    chosen = part.expert_choices(x)
    assert sorted(chosen) == ["o", "v"]
    for name, weight in (("v", part.sel_dst if shared else part.sel_src), ("o", part.sel_dst)):
        logits = (x @ weight.T).view(2, 7, N_HEADS, 6)
        top = logits.topk(2, dim=-1)
        assert chosen[name].index.shape == (2, 7, N_HEADS, 2)
        assert torch.equal(chosen[name].index, top.indices)
        torch.testing.assert_close(chosen[name].gate, torch.sigmoid(top.values))
    # the V the layer computes is the gated sum of exactly those experts
    v = torch.zeros(2, 7, N_HEADS, D_HEAD, dtype=torch.float64)
    experts = part.v_experts.view(N_HEADS, 6, D_MODEL, D_HEAD)
    for slot in range(2):
        ids, gate = chosen["v"].index[..., slot], chosen["v"].gate[..., slot]
        w = experts[torch.arange(N_HEADS), ids]  # [B, T, H, d, D]
        v += gate[..., None] * torch.einsum("btd,bthde->bthe", x, w)
    torch.testing.assert_close(part.project(x).v, v.transpose(1, 2))


def test_select_experts_top_k_within_groups():
    logits = torch.tensor([[[0.0, 3.0, -1.0, 2.0], [5.0, 4.0, 3.0, 2.0]]])
    sel = select_experts(logits, 2)
    assert sel.index.sort(-1).values.tolist() == [[[1, 3], [0, 1]]]
    assert sel.gate.dtype == torch.float32
    soft = select_experts(logits.half(), 2, mode="softmax")
    torch.testing.assert_close(soft.gate.sum(-1), torch.ones(1, 2))


def make_layer(positions, projections=None):
    ctx = make_ctx(d_head=8)
    proj = projections or {"name": "switchhead", "n_experts": 4, "k": 2}
    cfg = AttentionConfig(n_heads=N_HEADS, d_head=8, projections=proj, positions=positions)
    return Attention(ctx, cfg).double().eval()


POSITION_SPECS = {
    "rope-half": {"name": "rope", "fraction": 0.5},
    "xl-no-bias": {"name": "xl", "content_bias": False},
    "none": "none",
}


@pytest.mark.parametrize("positions", POSITION_SPECS.values(), ids=POSITION_SPECS.keys())
def test_cached_decoding_equals_full_pass(positions):
    layer = make_layer(positions)
    x = torch.randn(2, 12, D_MODEL, dtype=torch.float64)
    full = layer(x).hidden
    out = layer(x[:, :8], use_cache=True)
    pieces, cache = [out.hidden], out.cache
    for t in range(8, 12):
        out = layer(x[:, t:t + 1], cache=cache, use_cache=True)
        pieces.append(out.hidden)
        cache = out.cache
    assert cache.v.shape == (2, N_HEADS, 12, 8)  # V after expert mixing, H heads
    assert (torch.cat(pieces, 1) - full).abs().max() < 1e-10


@pytest.mark.parametrize("positions", POSITION_SPECS.values(), ids=POSITION_SPECS.keys())
def test_causality(positions):
    layer = make_layer(positions)
    x = torch.randn(1, 10, D_MODEL, dtype=torch.float64)
    y = x.clone()
    y[:, 6:] = torch.randn(1, 4, D_MODEL, dtype=torch.float64)
    a, b = layer(x).hidden, layer(y).hidden
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=1e-12)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3


def test_xl_position_keys_get_the_qk_prescale():
    """The layer equals a hand-built pass: scores (q k + q r) with q, k, r all * D**-0.25."""
    layer = make_layer({"name": "xl", "content_bias": False})
    x = torch.randn(1, 6, D_MODEL, dtype=torch.float64)
    p = layer.projections.project(x)
    bias = layer.positions.score_bias(p.q, p.k, torch.arange(6), torch.arange(6), 1.0, 1.0)
    bias = bias.dense() * layer.projections.qk_prescale
    scores = p.q @ p.k.transpose(-1, -2) + bias
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(scores, -1) @ p.v
    expected, _ = layer.projections.output(o, p)
    torch.testing.assert_close(layer(x).hidden, expected, rtol=1e-10, atol=1e-12)


def count_block(d_ff, n_heads, d_head, projections, positions):
    cfg = ModelConfig(vocab_size=8, d_model=412, n_layers=16, d_ff=d_ff,
                      attention={"n_heads": n_heads, "d_head": d_head,
                                 "projections": projections, "positions": positions})
    return sum(p.numel() for p in Block(cfg, 0).parameters())


def test_parameter_count_of_the_47m_wt103_layers():
    """Paper: 2,540,412 (SwitchHead H2 E5 k2 d_head 76 d_ff 2080) vs 2,540,385 (dense H10
    d_head 41 d_ff 2053) per layer. Those counts include the MLP biases (d_ff + d_model),
    which attnlab's bias-free dense MLP does not have, and no XL u/v vectors."""
    switch = count_block(2080, 2, 76, {"name": "switchhead", "n_experts": 5, "k": 2},
                         {"name": "xl", "content_bias": False})
    dense = count_block(2053, 10, 41, "dense", {"name": "xl", "content_bias": False})
    assert switch + 2080 + 412 == 2_540_412
    assert dense + 2053 + 412 == 2_540_385
    assert switch == dense == 2_537_920
    with_uv = count_block(2053, 10, 41, "dense", {"name": "xl", "content_bias": True})
    assert with_uv - dense == 2 * 10 * 41  # the dense XL biases are not in the paper's count


@pytest.mark.parametrize(
    "options, match",
    [
        ({"n_experts": 2, "k": 3}, r"k must be in \[1, n_experts=2\]"),
        ({"k": 0}, "k must be in"),
        ({"n_experts": 0}, "n_experts must be >= 1"),
        ({"expert_dropout": 1.0}, "expert_dropout"),
        ({"selection": "gumbel"}, "selection must be one of"),
        ({"n_experts": 1, "k": 1, "expert_q": True}, "need n_experts > 1"),
        ({"selection": "softmax", "k": 1}, "constant gate"),
    ],
)
def test_bad_options_are_rejected(options, match):
    with pytest.raises(ConfigError, match=match):
        AttentionConfig(projections={"name": "switchhead", **options})


def test_decoder_lm_trains_with_switchhead():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32, d_model=32, n_layers=2, d_ff=64, max_seq_len=32,
                      attention={"n_heads": 2, "d_head": 8, "positions": "rope",
                                 "projections": {"name": "switchhead", "n_experts": 4, "k": 2,
                                                 "expert_dropout": 0.1}})
    model = DecoderLM(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 32, (8, 17))
    losses = []
    for _ in range(15):
        out = model(ids[:, :-1], targets=ids[:, 1:])
        assert out.aux_loss.item() == 0.0
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0] - 0.5
