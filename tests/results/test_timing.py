"""Benchmark timing: the alternating timer, fwd/fwdbwd calls, peak memory."""

from __future__ import annotations

import pytest
import torch

from attnlab.results import fwd, fwdbwd, peak_memory_mb, time_side_by_side

MIB = 2**20


def test_timer_alternates_candidates_and_excludes_warmup():
    log: list[str] = []
    fns = {name: (lambda name=name: log.append(name)) for name in "abc"}
    timings = time_side_by_side(fns, {"a": 5, "b": 7, "c": 5}, warmup=2)
    assert log[:6] == ["a", "a", "b", "b", "c", "c"]  # warm-up, untimed
    assert log[6:] == ["a", "b", "c"] * 5 + ["b", "b"]
    assert {k: len(t.times_ms) for k, t in timings.items()} == {"a": 5, "b": 7, "c": 5}
    assert all(t.min <= t.median for t in timings.values())



def test_timer_measures_wall_clock():
    import time

    timings = time_side_by_side({"sleep": lambda: time.sleep(0.004), "noop": lambda: None}, 5)
    assert timings["sleep"].min >= 4.0  # no upper bound: a loaded machine may stall any call
    assert timings["noop"].median < timings["sleep"].median



def test_timer_requires_five_reps():
    with pytest.raises(ValueError, match="at least 5 reps"):
        time_side_by_side({"a": lambda: None}, 4)



def test_fwd_runs_without_autograd():
    x = torch.randn(3, requires_grad=True)
    seen = []
    fwd(lambda: seen.append((x * 2).requires_grad) or x)()
    assert seen == [False]



def test_fwdbwd_backpropagates_a_fixed_gradient_and_resets_grads():
    x = torch.randn(4, 3, requires_grad=True)
    grads = []
    x.register_hook(lambda g: grads.append(g.clone()))
    step = fwdbwd(lambda: x * 3.0, [x])
    step()
    step()
    assert x.grad is None
    assert len(grads) == 2 and torch.equal(grads[0], grads[1])
    assert grads[0].abs().sum() > 0


def _alloc(mib: int) -> torch.Tensor:
    return torch.ones(mib * MIB // 4)  # float32, touched



def test_peak_memory_reads_a_known_allocation():
    assert peak_memory_mb(lambda: _alloc(100)) == pytest.approx(100, abs=1)



def test_peak_memory_is_the_peak_of_live_bytes_not_the_total():
    def sequential():
        for _ in range(3):
            _alloc(40)  # freed before the next one

    def overlapping():
        kept = [_alloc(40) for _ in range(3)]
        return len(kept)

    assert peak_memory_mb(sequential) == pytest.approx(40, abs=1)
    assert peak_memory_mb(overlapping) == pytest.approx(120, abs=1)



def test_peak_memory_excludes_memory_held_before_the_call():
    held = _alloc(64)
    assert peak_memory_mb(lambda: held.sum()) < 1
