"""The ``sea`` attention core: decoding, causality, padding, dense limit, query skip, config."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.layers import Attention, AttentionConfig, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.sea import SEACore, SEAOptions, SEAState
from attnlab.ops.attention import softmax_attention
from attnlab.ops.attention.activations import attention_weights
from attnlab.utils.testing import assert_close

F64 = torch.float64
SMALL = {"k": 2, "predictor_length": 8}  # T = 30 rows: the mask is really sparse


def make_ctx(causal=True, n_layers=2, max_seq_len=64):
    return LayerContext(d_model=32, n_heads=4, d_head=8, causal=causal, max_seq_len=max_seq_len,
                        layer_idx=0, n_layers=n_layers, init_scale=1.0)


def make_layer(causal=True, positions="rope", n_kv_heads=None, projections=None, **options):
    projections = projections or {"name": "dense", "n_kv_heads": n_kv_heads}
    cfg = AttentionConfig(n_heads=4, d_head=8, positions=positions, projections=projections,
                          core={"name": "sea", **SMALL, **options})
    torch.manual_seed(0)
    return Attention(make_ctx(causal), cfg).double().eval()


def make_core(causal=True, max_seq_len=64, **options):
    torch.manual_seed(0)
    return SEACore(make_ctx(causal, max_seq_len=max_seq_len),
                   SEAOptions(**{**SMALL, **options})).double().eval()


def qkv(b=2, t=30, h=4, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=gen, dtype=F64) for _ in range(3)]


def decode_in_pieces(layer, x, bounds, key_padding_mask=None):
    """Feed ``x [B, T, d]`` in the pieces ``[bounds[i], bounds[i+1])`` through the cache."""
    pieces, cache = [], None
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        mask = None if key_padding_mask is None else key_padding_mask[:, :stop]
        out = layer(x[:, start:stop], cache=cache, use_cache=True, key_padding_mask=mask)
        pieces.append(out.hidden)
        cache = out.cache
    return torch.cat(pieces, dim=1), cache


BOUNDS = [0, 11, 12, 16, *range(17, 31)]  # a prefix, a 4-token piece, then token by token


def assert_padded_decoding_equals_full_pass(layer):
    """``layer`` (d_model 32, float64) fed token by token through its cache, with a
    left-padded row, gives the full pass's outputs on every real token."""
    x = torch.randn(2, 30, 32, dtype=F64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, :7] = False
    with torch.no_grad():
        full = layer(x, key_padding_mask=mask).hidden
        steps, _ = decode_in_pieces(layer, x, BOUNDS, key_padding_mask=mask)
    torch.testing.assert_close(steps[mask], full[mask], rtol=0, atol=1e-12)


@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "no_grad"])
@pytest.mark.parametrize("query_skip", [1, 3])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_cached_decoding_equals_full_pass(query_skip, n_kv_heads, inference):
    """With autograd on the PyTorch selection runs; under no_grad the native kernel (when it
    builds) selects and attends, and single-row steps run on one thread."""
    layer = make_layer(n_kv_heads=n_kv_heads, query_skip=query_skip)
    x = torch.randn(2, 30, 32, dtype=F64)
    with torch.set_grad_enabled(not inference):
        full = layer(x).hidden
        steps, cache = decode_in_pieces(layer, x, BOUNDS)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-10)
    state = cache.core_state
    assert isinstance(state, SEAState) and state.n_tokens == 30
    assert state.estimator.image_rows.shape[-2] == 8
    assert state.value_sum.shape == (2, 4 if n_kv_heads is None else 2, 8)


@pytest.mark.parametrize("inference", [False, True], ids=["autograd", "no_grad"])
def test_left_padded_cached_decoding_equals_full_pass_and_the_unpadded_rows(inference):
    """A batch of prompts of different lengths (left padding): decoding equals the full pass
    on the real tokens, and each row equals its prompt decoded alone (no RoPE here: the layer
    would rotate by absolute position; SEA's own position code counts real keys)."""
    layer = make_layer(positions="none")
    x = torch.randn(2, 30, 32, dtype=F64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, :7] = False
    with torch.set_grad_enabled(not inference):
        full = layer(x, key_padding_mask=mask).hidden
        steps, cache = decode_in_pieces(layer, x, BOUNDS, key_padding_mask=mask)
        alone, _ = decode_in_pieces(layer, x[1:, 7:], [0, 4, 5, 9, *range(10, 24)])
    torch.testing.assert_close(steps[mask], full[mask], rtol=0, atol=1e-10)
    torch.testing.assert_close(steps[1, 7:], alone[0], rtol=0, atol=1e-10)
    assert cache.core_state.n_real.tolist() == [30, 23]


@pytest.mark.parametrize(("n_kv_heads", "positions"), [(None, "none"), (2, "none"),
                                                      (None, "alibi")])
def test_long_prefill_in_row_blocks_equals_one_pass(monkeypatch, n_kv_heads, positions):
    """A causal prefill longer than PREFILL_ROWS runs in blocks continuing the decoding
    state: the same output and state as one pass, left padding and score biases included
    (on the sparse path, as a long prefill runs: the native kernel, ALiBi included)."""
    import attnlab.layers.sea.core as sea_module

    layer = make_layer(n_kv_heads=n_kv_heads, positions=positions, attention_path="sparse")
    x = torch.randn(2, 30, 32, dtype=F64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, :6] = False
    with torch.no_grad():
        one = layer(x, key_padding_mask=mask, use_cache=True)
        monkeypatch.setattr(sea_module, "PREFILL_ROWS", 7)  # 5 blocks, the last of 2 rows
        blocks = layer(x, key_padding_mask=mask, use_cache=True)
        step = torch.randn(2, 1, 32, dtype=F64)
        mask31 = torch.cat((mask, torch.ones(2, 1, dtype=torch.bool)), 1)
        after = [layer(step, key_padding_mask=mask31, cache=out.cache, use_cache=True).hidden
                 for out in (one, blocks)]
    torch.testing.assert_close(blocks.hidden[mask], one.hidden[mask], rtol=0, atol=1e-10)
    torch.testing.assert_close(after[1], after[0], rtol=0, atol=1e-10)
    assert blocks.cache.core_state.n_tokens == 30


def test_bfloat16_decoding_is_within_bfloat16_error_of_float32():
    """A bf16 model (every key selected, so the estimate's own rounding cannot change which
    keys are read): full pass and cached decoding within bf16's error of the float32 layer."""
    layer = make_layer(k=64).float()
    x = torch.randn(2, 30, 32)
    with torch.no_grad():
        ref = layer(x).hidden
        low = copy.deepcopy(layer).to(torch.bfloat16)
        full = low(x.to(torch.bfloat16)).hidden
        steps, _ = decode_in_pieces(low, x.to(torch.bfloat16), BOUNDS)
    eps = torch.finfo(torch.bfloat16).eps
    for name, out in (("full", full), ("decode", steps)):
        assert out.dtype == torch.bfloat16
        assert_close(name, ref, out, 4 * eps)  # inputs, weights, scores and output rounded


def test_stale_state_is_not_used():
    """A trimmed cache: the estimator restarts from the given queries (no stale rows)."""
    layer = make_layer()
    x = torch.randn(1, 20, 32, dtype=F64)
    cache = layer(x[:, :12], use_cache=True).cache
    step = layer(x[:, 12:], cache=cache.trimmed(5)).hidden
    assert torch.isfinite(step).all()
    # same as handing the core no state at all
    cache.core_state = None
    torch.testing.assert_close(step, layer(x[:, 12:], cache=cache.trimmed(5)).hidden)


def test_causality_future_tokens_do_not_change_the_past():
    for query_skip in (1, 4):
        layer = make_layer(query_skip=query_skip)
        x = torch.randn(2, 30, 32, dtype=F64)
        y = x.clone()
        y[:, 13:] = 3 * torch.randn(2, 17, 32, dtype=F64)
        a, b = layer(x).hidden, layer(y).hidden
        assert torch.equal(a[:, :13], b[:, :13])
        assert (a[:, 13:] - b[:, 13:]).abs().max() > 1e-3


def _open_gates(core):
    """sigmoid(s0) = sigmoid(s1) = 1: the output is the sparse attention alone."""
    with torch.no_grad():
        core.estimator.scalers.weight.zero_()
        core.estimator.scalers.bias.fill_(60.0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_a_mask_covering_all_keys_is_dense_attention(causal):
    core = make_core(causal, k=64, output="mix")  # k >= T: every bin, every key
    _open_gates(core)
    q, k, v = qkv()
    out = core(q, k, v, scale=0.3).out
    torch.testing.assert_close(out, softmax_attention(q, k, v, scale=0.3, causal=causal),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_gate_init_starts_with_the_gates_open(causal):
    q, k, v = qkv()
    dense = softmax_attention(q, k, v, scale=0.3, causal=causal)
    opened = make_core(causal, k=64, output="mix", gate_init=60.0)(q, k, v, scale=0.3).out
    torch.testing.assert_close(opened, dense, rtol=1e-12, atol=1e-12)
    halfway = make_core(causal, k=64, output="mix")(q, k, v, scale=0.3).out  # SEA's gates ~0.5
    assert (halfway - dense).abs().max() > 0.1


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_sparse_and_dense_attention_paths_agree(causal):
    q, k, v = (x.requires_grad_() for x in qkv(t=70))  # 2 row blocks
    results = []
    for path in ("sparse", "dense"):
        core = make_core(causal, max_seq_len=70, attention_path=path)
        out = core(q, k, v, scale=0.3).out
        results.append((out, torch.autograd.grad(out.square().sum(), (q, k, v))))
    (a, grads_a), (b, grads_b) = results
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(ga, gb, rtol=0, atol=1e-11)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_inference_paths_agree_under_padding(causal):
    """Without autograd the sparse path runs the native kernel (where it builds), with ranks
    mapped to the positions of real keys. Compared on real queries: a padded query's estimate
    is flat (its CNN rows are zeroed), so its cells tie exactly and either path may pick any
    of the equals."""
    q, k, v = qkv(t=70)
    mask = torch.ones(2, 70, dtype=torch.bool)
    mask[0, 5:9] = False
    mask[1, 60:] = False
    with torch.no_grad():
        a, b = (make_core(causal, 70, attention_path=path)(q, k, v, scale=0.3,
                                                       key_padding_mask=mask).out
                for path in ("sparse", "dense"))
    real = mask[:, None, :, None].expand_as(a)
    torch.testing.assert_close(a[real], b[real], rtol=0, atol=1e-12)


def test_really_sparse_rows_differ_from_dense_but_stay_convex():
    """With the mask really sparse, each long row is still an exact softmax (times sigmoid(s0))
    over its own keys: the output differs from dense attention but is a convex combination."""
    core = make_core(k=2)
    _open_gates(core)
    q, k, v = qkv(t=60)
    out = core(q, k, v, scale=0.3).out
    dense = softmax_attention(q, k, v, scale=0.3, causal=True)
    assert (out - dense)[..., 40:, :].abs().max() > 1e-3
    assert (out.abs() <= v.abs().amax(2, keepdim=True) + 1e-12).all()


def test_key_padding_has_no_influence():
    layer = make_layer()
    x = torch.randn(2, 20, 32, dtype=F64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, 3:6] = False
    mask[1, :4] = False
    y = x.clone()
    y[~mask] = 5 * torch.randn(int((~mask).sum()), 32, dtype=F64)
    a = layer(x, key_padding_mask=mask).hidden
    b = layer(y, key_padding_mask=mask).hidden
    torch.testing.assert_close(a[mask], b[mask], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("causal", "group"), [(True, "heads"), (False, "heads"),
                                               (False, "batch")],
                         ids=["causal", "bidir", "bidir-batch"])
def test_right_padded_batch_equals_the_unpadded_rows(causal, group):
    """Padding changes no real token (with the batch top-k, padded rows take no budget)."""
    layer = make_layer(causal, topk_group=group)
    x = torch.randn(2, 20, 32, dtype=F64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 13:] = False
    batch = layer(x, key_padding_mask=mask).hidden
    alone = layer(x[1:, :13]).hidden
    torch.testing.assert_close(batch[1:, :13], alone, rtol=0, atol=1e-10)


def test_batch_topk_is_bidirectional_only():
    with pytest.raises(ConfigError, match="'batch' ranks a sample's cells across rows"):
        make_layer(True, topk_group="batch")
    layer = make_layer(False, topk_group="batch", k=2)
    x = torch.randn(2, 20, 32, dtype=F64)
    assert torch.isfinite(layer(x).hidden).all()


def test_the_bidirectional_output_norm_spans_the_concatenated_heads():
    """output: norm is SEA's LayerNorm over H * d_head; norm_head one over d_head."""
    q, k, v = qkv(b=1, t=12)
    core = make_core(False, output="norm", gate_init=60.0, k=64)  # every key, gates open
    assert core.output_norm.normalized_shape == (4 * 8,)
    mixed = softmax_attention(q, k, v, scale=0.3, causal=False)
    joined = mixed.transpose(1, 2).reshape(1, 12, 32)
    expected = torch.nn.functional.layer_norm(joined, (32,)).view(1, 12, 4, 8).transpose(1, 2)
    assert_close("norm", expected + mixed, core(q, k, v, scale=0.3).out, 1e-10)
    assert make_core(False, output="norm_head").output_norm.normalized_shape == (8,)
    assert make_core(False).output_norm.normalized_shape == (32,)  # auto: norm


def test_bidirectional_kl_is_divided_by_the_real_tokens():
    """SEA's BERT form: the attention loss's KL summed over heads and keys, divided by the
    batch's real tokens (not by B * H * T rows as the causal batchmean)."""
    q, k, v = qkv(b=2, t=10)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 7:] = False
    hidden = ~mask[:, None, None, :]
    target = torch.softmax(torch.randn(2, 4, 10, 10, dtype=F64).masked_fill(hidden, -torch.inf),
                           -1)
    core = make_core(False).train()
    core.teacher_probs = target
    got = core(q, k, v, scale=0.3, key_padding_mask=mask).aux["sea_attention"] * core.n_layers
    logp = torch.log_softmax((q @ k.transpose(-1, -2) * 0.3).masked_fill(hidden, -torch.inf), -1)
    kl = torch.where(target > 0, target * (target.log() - logp), 0.0).sum() / 17
    mse = (logp.exp() - target).square().mean()
    torch.testing.assert_close(got, 0.1 * kl + mse, rtol=1e-10, atol=0)


def test_query_skip_reuses_the_estimate_of_the_earliest_row():
    core = make_core(query_skip=4)
    q, k, v = qkv(b=1, t=10)  # 10 is not a multiple of 4: rows 8, 9 reuse row 8
    keys = dict(key_mask=None, key_ranks=torch.arange(10)[None], n_real=torch.tensor([10]),
                state=None)
    logits, scalers, _ = core.estimator(q, k, v, scale=0.3, query_skip=4, **keys)
    for group in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9]):
        for row in group[1:]:
            assert torch.equal(logits[..., row, :], logits[..., group[0], :])
            assert torch.equal(scalers[..., row, :], scalers[..., group[0], :])
    full, _, _ = core.estimator(q, k, v, scale=0.3, query_skip=1, **keys)
    assert not torch.equal(full[..., 1, :], full[..., 0, :])


def test_dynamic_k_and_query_skip_switch_at_inference():
    layer = make_layer()
    x = torch.randn(1, 40, 32, dtype=F64)
    base = layer(x).hidden
    layer.core.set_inference(k=40)  # covers every key
    wide = layer(x).hidden
    layer.core.set_inference(query_skip=2)
    skipped = layer(x).hidden
    assert (base - wide).abs().max() > 1e-6 and (wide - skipped).abs().max() > 1e-6
    with pytest.raises(ValueError, match="k must be"):
        layer.core.set_inference(k=0)
    with pytest.raises(ValueError, match="query_skip"):
        layer.core.set_inference(query_skip=0)


def test_training_adds_the_estimate_loss_and_trains_the_estimator():
    layer = make_layer().train()
    x = torch.randn(2, 24, 32, dtype=F64)
    out = layer(x)
    assert set(out.aux) == {"sea_estimate"} and out.aux["sea_estimate"] > 0
    out.aux["sea_estimate"].backward()
    cnn = layer.core.estimator.cnn
    assert cnn.conv1.weight.grad.abs().sum() > 0 and cnn.out.weight.grad.abs().sum() > 0
    assert make_layer(estimator_loss=0.0).train()(x).aux == {}
    assert layer.eval()(x).aux == {}


def test_switchhead_projections_with_the_sea_core():
    projections = {"name": "switchhead", "n_experts": 4, "k": 2}
    layer = make_layer(projections=projections)
    x = torch.randn(2, 20, 32, dtype=F64)
    full = layer(x).hidden
    steps, _ = decode_in_pieces(layer, x, [0, 7, *range(8, 21)])
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-10)


def test_a_value_width_other_than_the_head_width_is_rejected():
    core = make_core()
    q, k, v = qkv(b=1, t=5)
    with pytest.raises(ValueError, match="value width"):
        core(q, k, v[..., :4], scale=0.3)


def _distance_bias(t: int) -> ScoreBias:
    """A per-head linear distance penalty (ALiBi-like, slopes 0.5 and 0.1) over t x t."""
    slopes = torch.tensor([0.5, 0.1, 0.5, 0.1], dtype=F64)
    return ScoreBias(lambda b, h, i, j: -slopes[h] * (i - j), 1, 4, t, t, torch.device("cpu"))


@pytest.mark.parametrize("activation", ["softmax1", "sigmoid"])
def test_score_activations_decode_as_the_full_pass(activation):
    """softmax1 / sigmoid on the selected keys: cached decoding equals the full pass, and
    the output differs from softmax's."""
    layer = make_layer(activation=activation)
    x = torch.randn(2, 20, 32, dtype=F64)
    with torch.no_grad():
        full = layer(x).hidden
        steps, _ = decode_in_pieces(layer, x, [0, 7, *range(8, 21)])
        softmax = make_layer()(x).hidden
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-10)
    assert (full - softmax).abs().max() > 1e-3


def test_a_sigmoid_student_is_distilled_on_each_keys_share_of_the_row_weight():
    """Against the (unnormalised) sigmoid weights of the same q, k, a sigmoid student's
    attention loss is zero: the loss compares shares of the row's weight."""
    q, k, v = qkv()
    scores = (q @ k.transpose(-1, -2)) * 0.3
    causal = torch.ones(30, 30, dtype=torch.bool).tril()
    teacher = attention_weights(scores, causal, "sigmoid", -2.0)
    core = make_core(True, activation="sigmoid", sigmoid_bias=-2.0).train()
    core.teacher_probs = teacher
    assert float(core(q, k, v, scale=0.3).aux["sea_attention"]) < 1e-12
    core.teacher_probs = attention_weights(scores, causal, "softmax")
    assert float(core(q, k, v, scale=0.3).aux["sea_attention"]) > 1e-5


def test_the_training_losses_see_the_score_bias():
    """The student's dense attention in the distillation loss includes the score bias: a
    teacher equal to the biased attention of the same q, k gives a zero attention loss,
    which the unbiased scores do not."""
    q, k, v = qkv()
    bias = _distance_bias(q.shape[-2])
    teacher = softmax_attention(q, k, v, scale=0.3, causal=True, score_bias=bias.dense(),
                                return_weights=True)[1]
    core = make_core(True).train()
    core.teacher_probs = teacher
    with_bias = core(q, k, v, scale=0.3, score_bias=bias).aux["sea_attention"]
    without = core(q, k, v, scale=0.3).aux["sea_attention"]
    assert float(with_bias) < 1e-12 < 1e-3 < float(without)


@pytest.mark.parametrize(("options", "match"), [
    ({"k": 0}, "k must be"),
    ({"predictor_length": 6}, "multiple of 4"),
    ({"topk_group": "rows"}, "topk_group"),
    ({"query_skip": 0}, "query_skip"),
    ({"output": "sum"}, "output"),
    ({"estimator_loss": -1.0}, "estimator_loss"),
    ({"kernel": "cos"}, "kernel"),
    ({"attention_path": "flash"}, "attention_path"),
    ({"predictor": 8}, "predictor_length"),
    ({"activation": "relu"}, "unknown score activation"),
    ({"sigmoid_bias": -2.0}, "sigmoid_bias is an option of activation 'sigmoid'"),
])
def test_bad_options_are_rejected(options, match):
    with pytest.raises((ValueError, ConfigError), match=match):
        AttentionConfig(n_heads=4, d_head=8, core={"name": "sea", **options}).validate()


@pytest.mark.parametrize("with_teacher", [True, False], ids=["teacher", "self-target"])
def test_training_losses_recomputed_in_backward_give_the_same_gradients(monkeypatch,
                                                                         with_teacher):
    """The [B, H, T, T] loss intermediates are recomputed in backward (checkpoint), not kept:
    the losses and every gradient equal the plain computation's."""
    q, k, v = qkv()
    teacher = softmax_attention(q, k, q, scale=0.5, causal=True, return_weights=True)[1] \
        if with_teacher else None

    def run():
        core = make_core(True).train()
        core.teacher_probs = teacher
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        aux = core(*leaves, scale=0.3).aux
        sum(aux.values()).backward()
        return aux, [x.grad for x in leaves] + [p.grad for p in core.parameters()]

    import attnlab.layers.sea.core as sea_module

    calls = []
    real = sea_module.checkpoint
    monkeypatch.setattr(sea_module, "checkpoint",
                        lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    aux, grads = run()
    assert calls  # the losses did go through the checkpoint
    monkeypatch.setattr(sea_module, "checkpoint", lambda fn, *args, **kwargs: fn(*args))
    plain_aux, plain_grads = run()
    assert aux.keys() == plain_aux.keys() and len(aux) == (2 if with_teacher else 1)
    for name in aux:
        torch.testing.assert_close(aux[name], plain_aux[name], rtol=1e-12, atol=0)
    for g, plain in zip(grads, plain_grads, strict=True):
        if plain is None:
            assert g is None
        else:
            torch.testing.assert_close(g, plain, rtol=1e-10, atol=1e-12)


def test_a_key_past_the_learned_position_table_is_an_error():
    layer = make_layer()  # max_seq_len=64
    x = torch.randn(1, 64, 32, dtype=F64)
    layer(x)  # the whole table is fine
    with pytest.raises(ValueError, match="has max_seq_len=64 rows, but a key is at position 64"):
        layer(torch.randn(1, 65, 32, dtype=F64))
    cache = layer(x, use_cache=True).cache
    with pytest.raises(ValueError, match="larger max_seq_len"):
        layer(torch.randn(1, 1, 32, dtype=F64), cache=cache)  # decoding past it, too
