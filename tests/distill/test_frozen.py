"""Frozen per-layer distillation of page estimators on a tiny Llama whose attention is
peaked: the estimators learn, the backbone is untouched, the file reloads to the same
selection, and bad recipes stop before any work."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab.hf
from attnlab.bench.hf import tiny_tokenizer
from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.distill.estimators import distill_estimators, load_recipe
from attnlab.distill.frozen import (
    FrozenRecipe,
    candidate_pages,
    estimator_logits,
    layer_samples,
    page_targets,
    sample_rows,
    train_layer,
)
from attnlab.layers.estimator_file import read_estimators, save_estimators
from attnlab.layers.page_estimator import PageEstimator
from tests.hf.models import save_model

SMALL = ["seq_len=192", "sequences=2", "rows=48", "steps=30", "page=4", "eval_budget=32",
         "lr=0.02", "check_every=10"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random Llama with sharpened queries and keys, so that its attention prefers
    some pages (a random model's is nearly uniform: nothing to learn)."""
    folder = save_model("llama", tmp_path_factory.mktemp("llama"), tiny_tokenizer(),
                        max_position_embeddings=512)
    model = attnlab.hf.load(folder)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def distilled(llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("estimators") / "out"
    before = {k: v.clone() for k, v in attnlab.hf.load(llama).state_dict().items()}
    summary = distill_estimators(llama, load_recipe(None, SMALL), out, progress=False)
    return out, summary, before


def test_estimators_learn_and_the_backbone_is_bit_identical(llama, distilled):
    out, summary, before = distilled
    assert summary["backbone_unchanged"]
    after = attnlab.hf.load(llama).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    for layer in summary["layers"]:
        assert layer["train_kl"][-1] < 0.85 * layer["train_kl"][0]
        held = layer["held_out"]
        assert held["kept_mass_after"] >= held["kept_mass_block"]
        assert held["kept_mass_after"] <= held["kept_mass_best"] + 1e-6
    assert {p.name for p in out.iterdir()} >= {"estimators.safetensors", "curves.json",
                                               "loss.png", "recipe.yaml"}
    assert json.loads((out / "curves.json").read_text())["tokens"] == 3 * 192


def test_the_file_loads_onto_the_model_with_its_facts(llama, distilled):
    out, _, _ = distilled
    meta, tensors = read_estimators(str(out / "estimators.safetensors"))
    assert (meta["n_layers"], meta["n_heads"], meta["d_head"], meta["page"]) == (2, 4, 8, 4)
    model = attnlab.hf.convert(attnlab.hf.load(llama), "sea_pages", {
        "budget": 32, "page": 4, "estimators": str(out / "estimators.safetensors")})
    for i, core in enumerate(attnlab.hf.cores(model)):
        assert torch.equal(core.scorer.query, tensors[f"layers.{i}.query"].float())
    ids = torch.randint(0, 64, (1, 120))
    full = model(ids).logits
    cached = model(ids[:, :100], use_cache=True)
    step = model(ids[:, 100:], cache=cached.cache).logits
    assert torch.allclose(full[:, 100:], step, atol=1e-5)


def test_saved_estimators_reproduce_the_trained_selection(llama, tmp_path):
    """Train one layer directly, save, reload through the core: the same page scores (to
    float16's precision) and the same kept mass."""
    recipe = load_recipe(None, SMALL)
    model = attnlab.hf.load(llama)
    from attnlab.distill.estimators import record_teacher

    ids = [torch.randint(0, 64, (recipe.seq_len,)) for _ in range(2)]
    rows = [sample_rows(recipe, torch.Generator().manual_seed(i)) for i in range(2)]
    samples = list(layer_samples(record_teacher(model, ids, rows, False), rows, 0, recipe,
                                 8 ** -0.5))
    estimator = PageEstimator(4, 8, recipe.width, recipe.distance_buckets)
    train_layer(estimator, samples[:1], samples[1], recipe, 8 ** -0.5, 2)
    path = tmp_path / "one.safetensors"
    save_estimators(path, {0: dict(estimator.named_parameters())},
                    {"d_model": 32, "n_layers": 1, "n_heads": 4, "d_head": 8, "page": 4,
                     "width": recipe.width, "n_buckets": recipe.distance_buckets})
    reloaded = PageEstimator(4, 8, recipe.width, recipe.distance_buckets)
    _, tensors = read_estimators(str(path))
    reloaded.load_state_dict({k.split(".", 2)[2]: v.float() for k, v in tensors.items()})
    with torch.no_grad():
        a = estimator_logits(estimator, samples[1], 4, 8 ** -0.5)
        b = estimator_logits(reloaded, samples[1], 4, 8 ** -0.5)
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    assert torch.allclose(a[finite], b[finite], atol=2e-2)


def test_page_targets_are_the_teachers_candidate_mass():
    recipe = FrozenRecipe(seq_len=40, page=4, eval_budget=16)
    q, k = torch.randn(2, 3, 5), torch.randn(1, 40, 5)
    positions = torch.tensor([9, 20, 39])
    candidates = candidate_pages(positions, 40, recipe)
    assert candidates[0].tolist()[:3] == [False, True, False]  # sink 0, own page 2
    target = page_targets(q, k, positions, candidates, 4, 0.5)
    scores = (q[:, 1] @ k[0, :21].T) * 0.5
    probs = torch.softmax(scores, -1)
    pages = torch.stack([probs[:, 4 * p:4 * p + 4].sum(-1) for p in (1, 2, 3, 4)], -1)
    assert torch.allclose(target[:, 1, 1:5], pages / pages.sum(-1, keepdim=True), atol=1e-6)
    assert not target[:, 1, 5:].any() and not target[:, 1, 0].any()
    assert torch.allclose(target.sum(-1), torch.ones(2, 3))


@pytest.mark.parametrize("sets, words", [
    (["page=5"], "eval_budget: budget 32 is not a whole number of pages of 5"),
    (["layers=[7]"], "names layer(s) [7], but the model has 2 layers"),
    (["seq_len=4096"], "beyond the model's 512 positions"),
    (["steps=0"], "steps must be >= 1"),
    (["nope=1"], "nope"),
])
def test_bad_recipes_are_one_line_exit_2_and_write_nothing(llama, tmp_path, capsys, sets,
                                                           words):
    out = tmp_path / "out"
    args = ["distill-estimators", "--model", str(llama), "--out", str(out), "--quiet"]
    for item in [*SMALL, *sets]:
        args += ["--set", item]
    assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and words in errors[0]
    assert not out.exists()


def test_a_recipe_file_needs_its_section(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("distill: {steps: 3}\n")
    with pytest.raises(ConfigError, match="one section, estimators:"):
        load_recipe(path)
    assert load_recipe("smollm2/estimators").seq_len == 8192
