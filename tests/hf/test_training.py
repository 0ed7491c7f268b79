"""Training converted models: auxiliary losses are collected per layer and train the cores."""

from __future__ import annotations

import subprocess
import sys

import pytest

import attnlab.hf
from tests.hf.models import FAMILIES, SEA_SPARSE, converted, outputs, token_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_collect_gathers_each_layers_estimator_loss(family):
    model = converted(family, "sea", SEA_SPARSE).train()
    ids = token_ids()
    with attnlab.hf.collect(model) as record:
        hidden = outputs(model, ids)
    outputs(model, ids)  # outside the block: not collected
    assert sorted(record.aux) == [0, 1]
    assert all(set(aux) == {"sea_estimate"} for aux in record.aux.values())
    (hidden.square().mean() + record.total()).backward()
    for core in attnlab.hf.cores(model):
        assert core.estimator.cnn.conv1.weight.grad.abs().sum() > 0


def test_import_attnlab_does_not_import_transformers():
    code = ("import sys, attnlab, attnlab.layers, attnlab.models; "
            "assert 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
