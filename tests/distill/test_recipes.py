"""Distillation recipes: sea-paper fills only what is unset; the context term's weight."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnlab.config import ConfigError, PartSpec
from attnlab.distill import load_distill_config
from attnlab.distill.config import DistillConfig
from attnlab.distill.loop import distill_loss
from attnlab.distill.pair import Forward
from attnlab.layers import CORES, LayerContext
from attnlab.layers.performer import default_n_features


def _distill(**section) -> DistillConfig:
    return load_distill_config(base={"distill": section}).distill


def test_the_default_recipe_keeps_attnlabs_settings():
    assert _distill() == DistillConfig()
    assert _distill(recipe="attnlab") == DistillConfig()


@pytest.mark.parametrize(("student", "options", "context_weight"), [
    ("sea", {}, 1.0),
    ("performer", {"feature_rule": "sea"}, 0.0),
    ("reformer", {"n_hashes": 8, "bucket_size": 64}, 0.0),
    ("window", {}, 0.0),
])
def test_sea_paper_sets_the_official_recipe(student, options, context_weight):
    d = _distill(recipe="sea-paper", student_attention=student)
    assert (d.lr, d.pretrained_lr_mult, d.context_weight) == (1e-5, 1.0, context_weight)
    assert d.student_attention == PartSpec(student, options)
    assert DistillConfig().lr == 1e-4 and DistillConfig().pretrained_lr_mult == 0.2


def test_explicit_settings_win_over_the_recipe():
    d = _distill(recipe="sea-paper", lr=3e-5, context_weight=0.5,
                 student_attention={"name": "reformer", "n_hashes": 2})
    assert (d.lr, d.pretrained_lr_mult, d.context_weight) == (3e-5, 1.0, 0.5)
    assert d.student_attention.options == {"n_hashes": 2, "bucket_size": 64}


def test_an_unknown_recipe_names_the_choices():
    with pytest.raises(ConfigError, match=r"unknown recipe 'paper'; choose one of "
                                          r"\['attnlab', 'sea-paper'\]"):
        _distill(recipe="paper")
    with pytest.raises(ValueError, match="recipe must be one of"):
        DistillConfig(recipe="paper").validate()


def test_sea_feature_rule_gives_the_estimators_feature_count():
    assert default_n_features(64) == 266
    assert default_n_features(64, causal=True, rule="sea") == 33
    assert default_n_features(64, causal=False, rule="sea") == 266
    ctx = LayerContext(d_model=128, n_heads=2, d_head=64)
    core = CORES.build(PartSpec("performer", {"feature_rule": "sea"}), ctx=ctx, dropout=0.0)
    assert core.projection.shape == (33, 64)
    with pytest.raises(ConfigError, match="feature_rule must be one of"):
        CORES.build(PartSpec("performer", {"feature_rule": "paper"}), ctx=ctx, dropout=0.0)


def test_context_weight_scales_only_the_context_term():
    torch.manual_seed(0)
    hidden = [torch.randn(2, 3, 4)]
    teacher = Forward(None, hidden, [torch.randn(2, 2, 3, 4)])
    student = Forward(None, [h + 0.1 for h in hidden], [torch.randn(2, 2, 3, 4)],
                      aux={"sea_estimate": torch.tensor(0.25)})
    base = DistillConfig()
    total, parts = distill_loss(base, student, teacher)
    without, parts0 = distill_loss(dataclasses.replace(base, context_weight=0.0), student,
                                   teacher)
    assert parts["context"] == parts0["context"] > 0  # still reported
    torch.testing.assert_close(total - without, torch.tensor(parts["context"]))
    expected = base.hidden_weight * parts["hidden"] + base.attention_weight * 0.25
    assert without.item() == pytest.approx(expected)
