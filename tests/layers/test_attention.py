import math

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.layers import CORES, Attention, AttentionConfig, CoreOutput, LayerContext
from attnlab.layers.cores import DenseCore, ScoreOptions
from attnlab.ops.attention import softmax_attention

POSITIONS = ["none", "learned", "rope", "xl"]


def make_layer(positions="rope", core="sdpa", causal=True, projections="dense", n_heads=4):
    ctx = LayerContext(d_model=32, n_heads=n_heads, d_head=8, causal=causal, max_seq_len=64,
                       layer_idx=0, n_layers=2, init_scale=1.0)
    cfg = AttentionConfig(n_heads=n_heads, d_head=8, projections=projections,
                          positions=positions, core=core)
    return Attention(ctx, cfg).double().eval()


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_sdpa_core_equals_eager_reference(positions, causal):
    layer = make_layer(positions, "sdpa", causal)
    ref = make_layer(positions, "eager", causal)
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False
    for m in (None, mask):
        out, expected = layer(x, key_padding_mask=m).hidden, ref(x, key_padding_mask=m).hidden
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("core", ["sdpa", "eager"])
def test_cached_decoding_equals_full_pass(positions, core):
    layer = make_layer(positions, core)
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    full = layer(x).hidden
    prefix = layer(x[:, :7], use_cache=True)
    pieces, cache = [prefix.hidden], prefix.cache
    for t in range(7, 12):  # then one token at a time
        step = layer(x[:, t : t + 1], cache=cache, use_cache=True)
        pieces.append(step.hidden)
        cache = step.cache
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)
    assert (torch.cat(pieces, dim=1) - full).abs().max() < 1e-12
    assert cache.length == 12


@pytest.mark.parametrize("positions", POSITIONS)
def test_causality_future_tokens_do_not_change_the_past(positions):
    layer = make_layer(positions)
    x = torch.randn(1, 10, 32, dtype=torch.float64)
    y = x.clone()
    y[:, 6:] = torch.randn(1, 4, 32, dtype=torch.float64)
    a, b = layer(x).hidden, layer(y).hidden
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=1e-12)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3  # and the future did change


def test_padded_keys_do_not_influence_real_tokens():
    layer = make_layer("rope", causal=False)
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[:, 5:] = False
    y = x.clone()
    y[:, 5:] = 100 * torch.randn(2, 3, 32, dtype=torch.float64)
    a = layer(x, key_padding_mask=mask).hidden
    b = layer(y, key_padding_mask=mask).hidden
    torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=1e-12)


def test_fully_masked_query_rows_are_finite():
    layer = make_layer("rope")
    x = torch.randn(1, 4, 32, dtype=torch.float64)
    mask = torch.tensor([[False, False, True, True]])
    out = layer(x, key_padding_mask=mask).hidden
    assert torch.isfinite(out).all()


def test_grouped_query_projection_matches_repeated_heads():
    layer = make_layer(projections={"name": "dense", "n_kv_heads": 2})
    assert layer.projections.k_proj.out_features == 2 * 8
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    p = layer.projections.project(x)
    assert p.k.shape == (2, 2, 6, 8) and p.q.shape == (2, 4, 6, 8)
    out = layer(x).hidden
    k = p.k.repeat_interleave(2, dim=1)
    v = p.v.repeat_interleave(2, dim=1)
    q, k = layer.positions.rotate(p.q, k, torch.arange(6), torch.arange(6))
    o = softmax_attention(q, k, v, scale=8**-0.5, causal=True)
    expected, _ = layer.projections.output(o, p)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_xl_relative_scores_depend_only_on_distance():
    layer = make_layer("xl", "eager")
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64).expand(1, 4, 3, 8)
    q = q[:, :, :1].expand(1, 4, 3, 8)  # the same query at three positions
    k = torch.zeros(1, 4, 5, 8, dtype=torch.float64)
    bias = layer.positions.score_bias(q, k, torch.arange(2, 5), torch.arange(5), scale=1.0,
                                     qk_prescale=1.0).dense()
    # query i sits at position 2+i; pairs with equal distance share the same bias
    assert torch.allclose(bias[..., 0, 0], bias[..., 1, 1])
    assert torch.allclose(bias[..., 1, 0], bias[..., 2, 1])
    assert not torch.allclose(bias[..., 0, 0], bias[..., 0, 1])


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (lambda: torch.randn(2, 5, 31, dtype=torch.float64), ValueError, "d_model=32"),
        (lambda: torch.randn(2, 5, dtype=torch.float64), ValueError, r"\[batch, seq, d_model"),
        (lambda: torch.ones(2, 5, 32, dtype=torch.long), TypeError, "floating-point"),
    ],
    ids=["wrong-width", "2d", "int"],
)
def test_bad_inputs_are_rejected(bad, error, match):
    with pytest.raises(error, match=match):
        make_layer()(bad())


def test_bad_masks_are_rejected():
    layer = make_layer()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"key_padding_mask must be \[batch=2, 5\]"):
        layer(x, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="must be bool"):
        layer(x, key_padding_mask=torch.ones(2, 5))


def test_unknown_part_lists_registered_names():
    with pytest.raises(ConfigError, match=r"unknown core 'sdap' \(did you mean 'sdpa'\?\).*eager"):
        AttentionConfig(core="sdap")
    with pytest.raises(ConfigError, match="unknown config key 'positions:rope.fractoin'"):
        AttentionConfig(positions={"name": "rope", "fractoin": 0.5})
    with pytest.raises(ConfigError, match="fraction must be in"):
        AttentionConfig(positions={"name": "rope", "fraction": 1.5})


@pytest.fixture
def core_without_score_bias():
    @CORES.register("test-no-bias")
    def _factory(ctx, options, dropout):
        """A core that cannot take a score bias."""
        return DenseCore(ctx, ScoreOptions(), dropout, softmax_attention)

    yield "test-no-bias"
    CORES.unregister("test-no-bias")


def test_incompatible_combination_is_rejected(core_without_score_bias):
    with pytest.raises(ConfigError, match="positions 'xl' adds a score bias.*cores that can"):
        AttentionConfig(positions="xl", core=core_without_score_bias)
    AttentionConfig(positions="rope", core=core_without_score_bias)  # fine without bias


def test_core_output_record_defaults():
    out = CoreOutput(torch.zeros(1))
    assert out.aux == {} and out.state is None


def test_layer_context_defaults_and_checks():
    ctx = LayerContext(d_model=32, n_heads=4)
    assert (ctx.d_head, ctx.causal, ctx.layer_idx, ctx.n_layers, ctx.init_scale) == (
        8, True, 0, 1, 1.0)
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        LayerContext(d_model=30, n_heads=4)
    assert LayerContext(d_model=30, n_heads=4, d_head=16).d_head == 16
    with pytest.raises(ValueError, match=r"layer_idx=2 is not in \[0, n_layers=2\)"):
        LayerContext(d_model=32, n_heads=4, layer_idx=2, n_layers=2)
    with pytest.raises(ValueError, match="n_heads must be >= 1"):
        LayerContext(d_model=32, n_heads=0)


@pytest.mark.parametrize("cfg", [AttentionConfig(n_heads=2), AttentionConfig(n_heads=4, d_head=16)])
def test_config_and_context_must_agree(cfg):
    with pytest.raises(ValueError, match="disagrees with LayerContext"):
        Attention(LayerContext(d_model=32, n_heads=4), cfg)
    Attention(LayerContext(d_model=32, n_heads=4), AttentionConfig(n_heads=4))  # d_head derived


def test_input_dtype_must_match_the_weights_outside_autocast():
    layer = Attention(LayerContext(d_model=32, n_heads=4), AttentionConfig(n_heads=4))
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    with pytest.raises(TypeError, match="input is torch.float64 but the layer's weights are "
                                        "torch.float32"):
        layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x.float()).hidden.dtype == torch.bfloat16


def test_a_cache_from_another_layer_shape_or_batch_is_refused():
    layer = make_layer()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    cache = layer(x, use_cache=True).cache
    assert cache.layer_idx == 0
    second = Attention(LayerContext(d_model=32, n_heads=4, layer_idx=1, n_layers=2),
                       AttentionConfig(n_heads=4)).double()
    with pytest.raises(ValueError, match="made by layer 0, not by this layer \\(1\\)"):
        second(x[:, :1], cache=cache)
    with pytest.raises(ValueError, match=r"cache.k is \(2, 4, 6, 8\), but this layer and batch "
                                         r"need \[1, 4, cached tokens, 8\]"):
        layer(x[:1, :1], cache=cache)
    two_heads = make_layer(n_heads=2)  # d_head stays 8: another shape
    with pytest.raises(ValueError, match="cache.k is"):
        two_heads(torch.randn(2, 1, 32, dtype=torch.float64), cache=cache)
    with pytest.raises(TypeError, match="cache.k is torch.float32 on cpu, but this layer "
                                        "computes torch.float64"):
        layer(x[:, :1], cache=cache.trimmed(6).__class__(cache.k.float(), cache.v.float()))
    assert layer(x[:, :1], cache=cache.selected(torch.arange(6))).hidden.shape == (2, 1, 32)


@pytest.mark.parametrize("activation", ["softmax1", "sigmoid"])
def test_dense_cores_take_a_score_activation(activation):
    core = {"name": "sdpa", "activation": activation}
    layer = make_layer("alibi", core)
    ref = make_layer("alibi", {**core, "name": "eager"})
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(layer(x).hidden, ref(x).hidden, rtol=0, atol=1e-12)
    # the weights a distillation recorder reads are the ones the core applies
    p = layer.projections.project(x)
    bias = layer.positions.score_bias(p.q, p.k, torch.arange(9), torch.arange(9), 0.3, 1.0)
    weights = layer.core.attention_weights(p.q, p.k, p.v, scale=0.3, score_bias=bias)
    out = layer.core(p.q, p.k, p.v, scale=0.3, score_bias=bias).out
    torch.testing.assert_close(out, weights @ p.v, rtol=0, atol=1e-12)
    assert (weights.sum(-1) < 1).all()  # neither normalises to 1


def test_score_activation_options():
    assert make_layer(core={"name": "eager", "activation": "sigmoid"}).core.sigmoid_bias == (
        pytest.approx(-math.log(64)))
    with pytest.raises(ConfigError, match="sigmoid_bias is an option of activation 'sigmoid'"):
        AttentionConfig(core={"name": "sdpa", "sigmoid_bias": -2.0})
    with pytest.raises(ConfigError, match="unknown score activation 'relu'"):
        AttentionConfig(core={"name": "sdpa", "activation": "relu"})
