"""The ``sea_pages`` core: its learned page scorer against a loop reference, its start at
block top-k's scores, causality with trained-looking weights, and its estimators files."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError, PartSpec
from attnlab.layers import CORES, LayerContext
from attnlab.layers.estimator_file import (
    layer_estimator,
    read_estimators,
    resolve,
    save_estimators,
    shipped,
)
from attnlab.layers.page_estimator import (
    PageEstimator,
    decode_macs,
    distance_buckets,
    page_summaries,
)
from attnlab.ops.attention.pages import paged_attention, paged_attention_naive
from attnlab.utils.testing import assert_close, assert_grads_close

F64 = torch.float64
B, H, HK, T, D = 2, 4, 2, 23, 8
PAD = 5


def random_estimator(seed: int = 0, width: int = 6, buckets: int = 4) -> PageEstimator:
    torch.manual_seed(seed)
    estimator = PageEstimator(H, D, width, buckets).to(F64)
    with torch.no_grad():
        for param in estimator.parameters():
            param.normal_()
    return estimator


def inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen, dtype=F64, requires_grad=True)
    k, v = (torch.randn(B, HK, T, D, generator=gen, dtype=F64, requires_grad=True)
            for _ in range(2))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :PAD] = False
    return q, k, v, mask


def test_distance_buckets_are_log2_of_the_page_distance_capped():
    d = torch.tensor([0, 1, 2, 3, 6, 7, 100, -3])
    assert distance_buckets(d, 4).tolist() == [0, 1, 1, 2, 2, 3, 3, 2]


def test_logits_equal_the_per_page_loop():
    estimator = random_estimator()
    q, k, _, _ = inputs()
    page, n_pages = 3, 8
    pages = (torch.arange(T) // page).expand(B, T)
    q_pages = pages.clone()
    logits = estimator(q, k, pages, n_pages, q_pages, 0.4).detach()
    for b in range(B):
        for h in range(H):
            for t in (0, 7, 22):
                for p in range(n_pages):
                    keys = k[b, h // (H // HK), p * page:(p + 1) * page]
                    want = estimator.page_logit(h, q[b, h, t], keys, int(q_pages[b, t]) - p, 0.4)
                    assert abs(float(logits[b, h, t, p]) - want) < 1e-10


def test_summaries_are_mean_min_max_and_skip_padding():
    k = torch.randn(1, 1, 6, 2, dtype=F64)
    pages = torch.tensor([[-1, 0, 0, 1, 1, 1]])
    summary = page_summaries(k, pages, 2)
    assert_close("page 0", torch.cat((k[0, 0, 1:3].mean(0), k[0, 0, 1:3].min(0).values,
                                      k[0, 0, 1:3].max(0).values)), summary[0, 0, 0], 1e-15)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("padded", [True, False], ids=["padded", "gathered"])
def test_paged_attention_with_the_estimator_equals_the_loop_reference(monkeypatch, causal,
                                                                      padded):
    monkeypatch.setattr("attnlab.ops.attention.pages.GATHER_RATIO", 1)
    estimator = random_estimator(1)
    q, k, v, mask = inputs(1)
    kw = dict(scale=0.35, budget=12, page=3, scorer=estimator, causal=causal,
              key_padding_mask=mask if padded else None)
    out, ref = paged_attention(q, k, v, **kw), paged_attention_naive(q, k, v, **kw)
    rows = slice(PAD, None) if padded else slice(None)
    assert_close("learned pages", ref[..., rows, :], out[..., rows, :], 1e-12)
    assert_grads_close(ref[..., rows, :], out[..., rows, :], [q, k, v], "qkv", 1e-12)


def ctx(**kw) -> LayerContext:
    return LayerContext(d_model=H * D, n_heads=H, d_head=D, **kw)


def test_an_untrained_core_scores_as_block_top_k_at_its_page():
    q, k, v, mask = inputs(2)
    options = {"budget": 12, "page": 3}
    learned = CORES.build(PartSpec("sea_pages", options), ctx=ctx(), dropout=0.0)
    block = CORES.build(PartSpec("block", options), ctx=ctx(), dropout=0.0)
    kw = dict(scale=0.35, key_padding_mask=mask)
    assert torch.equal(learned(q, k, v, **kw).out, block(q, k, v, **kw).out)


def test_a_trained_looking_core_is_causal():
    core = CORES.build(PartSpec("sea_pages", {"budget": 12, "page": 3}), ctx=ctx(),
                       dropout=0.0).to(F64)
    core.scorer.load_state_dict(random_estimator(3, width=64, buckets=12).state_dict())
    q, k, v, _ = inputs(3)
    out = core(q, k, v, scale=0.35).out
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[..., 15:, :] += 5.0
    v2[..., 15:, :] -= 3.0
    assert torch.equal(out[..., :15, :], core(q, k2, v2, scale=0.35).out[..., :15, :])


def saved(tmp_path, n_layers: int = 2, **meta_changes):
    layers = {i: dict(random_estimator(i, width=64, buckets=12).named_parameters())
              for i in range(n_layers)}
    meta = {"model": "tiny", "d_model": H * D, "n_layers": n_layers, "n_heads": H, "d_head": D,
            "page": 3, "width": 64, "n_buckets": 12, **meta_changes}
    path = tmp_path / "est.safetensors"
    save_estimators(path, layers, meta)
    return path, layers


def test_a_saved_set_loads_onto_each_layer_in_float16(tmp_path):
    path, layers = saved(tmp_path)
    spec = PartSpec("sea_pages", {"budget": 12, "page": 3, "estimators": str(path)})
    for i in range(2):
        core = CORES.build(spec, ctx=ctx(layer_idx=i, n_layers=2), dropout=0.0)
        assert torch.equal(core.scorer.key, layers[i]["key"].detach().half().float())
    meta, _ = read_estimators(str(path))
    assert meta["model"] == "tiny" and meta["page"] == 3


@pytest.mark.parametrize("change, words", [
    ({"n_layers": 3}, "n_layers 3 (this model/core: 2)"),
    ({"d_head": 16}, "d_head 16"),
    ({"page": 4}, "page 4"),
])
def test_estimators_for_another_shape_are_refused_by_name(tmp_path, change, words):
    path, _ = saved(tmp_path, **change)
    spec = PartSpec("sea_pages", {"budget": 12, "page": 3, "estimators": str(path)})
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        CORES.build(spec, ctx=ctx(n_layers=2), dropout=0.0)


def test_a_missing_or_foreign_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no shipped set"):
        resolve("no-such-model")
    with pytest.raises(ConfigError, match="no such file"):
        resolve(str(tmp_path / "x.safetensors"))
    bad = tmp_path / "bad.safetensors"
    bad.write_text("not safetensors")
    with pytest.raises(ConfigError, match="not a readable safetensors file"):
        read_estimators(str(bad))
    path, _ = saved(tmp_path)
    with pytest.raises(ConfigError, match="no layer 5"):
        layer_estimator(str(path), 5, {"d_model": H * D, "n_layers": 2, "n_heads": H,
                                       "d_head": D, "page": 3, "width": 64, "n_buckets": 12})


@pytest.mark.parametrize(("name", "page"), [("smollm2-135m", 16), ("smollm2-135m-p8", 8),
                                             ("smollm2-135m-p4", 4)])
def test_the_shipped_smollm2_sets_fit_smollm2(name, page):
    assert name in shipped()
    meta, tensors = read_estimators(name)
    assert (meta["n_layers"], meta["n_heads"], meta["d_head"], meta["d_model"]) == (30, 9, 64, 576)
    assert len(tensors) == 3 * 30 and meta["recipe"]["seq_len"] == 8192
    assert meta["page"] == meta["recipe"]["page"] == page


def test_decode_cost_counts_the_query_projection_and_one_product_per_page():
    assert decode_macs(9, 64, 64, 8192, 16) == 9 * 64 * (64 + 512)
