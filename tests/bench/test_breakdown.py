"""The SEA phase breakdown: every phase timed inside the block, nothing patched after it."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench.breakdown import LEAVES, sea_breakdown
from attnlab.layers.performer import PerformerCore
from attnlab.layers.sea import SEACore, SEAOptions
from attnlab.layers.sea import core as sea_core
from tests.layers.test_sea_core import make_ctx, qkv


def test_phases_of_a_sea_forward_add_up_to_the_core():
    torch.manual_seed(0)
    core = SEACore(make_ctx(), SEAOptions(k=2, predictor_length=8)).double().eval()
    q, k, v = qkv(t=40)
    originals = (SEACore.forward, PerformerCore.extend, sea_core.selected_attention)
    with torch.no_grad(), sea_breakdown() as result:
        out = core(q, k, v, scale=0.3)
        core(q[..., -1:, :], k, v, scale=0.3)  # a stateless call: the Performer recomputes
        core(q[..., -1:, :], k, v, scale=0.3, state=out.state)  # a decoding step
    assert (SEACore.forward, PerformerCore.extend, sea_core.selected_attention) == originals
    phases = result.phases()
    assert list(phases) == [*LEAVES, "sea core"]
    assert result.calls["sea core"] == 3 and result.calls["performer"] == 3  # not nested twice
    for name in ("performer", "encoder", "cnn", "selection + attention", "average context"):
        assert phases[name] > 0, name
    assert sum(phases[name] for name in LEAVES) == pytest.approx(phases["sea core"], rel=1e-6)
