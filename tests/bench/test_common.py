"""Benchmark infrastructure: machine info, alternating timer, fwd/fwdbwd, peak memory, records."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.bench.common import (
    Record,
    fill_ratios,
    format_table,
    fwd,
    fwdbwd,
    machine_info,
    peak_memory_mb,
    read_json,
    time_side_by_side,
    write_json,
)
from attnlab.utils.provenance import available_cores

MIB = 2**20


def test_machine_info_schema():
    info = machine_info()
    assert set(info) == {"cpu", "cores", "threads", "gpu", "torch", "malloc_tuned"}
    assert isinstance(info["cpu"], str) and info["cpu"]
    assert info["threads"] == torch.get_num_threads()
    assert info["cores"] == available_cores() >= 1
    assert info["gpu"] is None or isinstance(info["gpu"], str)
    assert info["torch"] == torch.__version__


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


def _rec(name, ms, pass_="fwd", tokens=8, bench="b"):
    return Record(bench, name, pass_, {"tokens": tokens}, ms, ms * 0.9, 1.5)


def test_fill_ratios_divides_by_the_matching_baseline():
    records = [
        _rec("base", 10.0), _rec("fast", 5.0),
        _rec("base", 20.0, pass_="fwdbwd"), _rec("fast", 30.0, pass_="fwdbwd"),
        _rec("base", 4.0, tokens=16), _rec("fast", 2.0, tokens=16),
    ]
    fill_ratios(records, "base")
    assert [r.ratio for r in records] == [1.0, 0.5, 1.0, 1.5, 1.0, 0.5]
    assert all(r.baseline == "base" for r in records)


def test_fill_ratios_needs_a_baseline_per_group():
    with pytest.raises(ValueError, match="no 'base' record for bench='b' pass='fwdbwd'"):
        fill_ratios([_rec("base", 1.0), _rec("fast", 1.0, pass_="fwdbwd")], "base")


def test_record_rejects_unknown_pass():
    with pytest.raises(ValueError, match="pass must be one of"):
        _rec("x", 1.0, pass_="bwd")


def test_json_round_trip_and_schema(tmp_path):
    records = fill_ratios([_rec("base", 2.0), _rec("fast", 1.0)], "base")
    path = write_json(tmp_path / "out" / "bench.json", records)
    payload = json.loads(path.read_text())
    assert set(payload) == {"machine", "results"}
    assert set(payload["results"][1]) == {
        "bench", "name", "pass", "shape", "ms_median", "ms_min", "peak_mem_mb", "baseline",
        "ratio",
    }
    assert payload["results"][1]["pass"] == "fwd" and payload["results"][1]["ratio"] == 0.5
    machine, back = read_json(path)
    assert machine == machine_info()
    assert back == records
    assert [p.name for p in path.parent.iterdir()] == ["bench.json"]  # no temp file left


def test_write_json_refuses_records_without_ratio(tmp_path):
    with pytest.raises(ValueError, match="without a ratio"):
        write_json(tmp_path / "x.json", [_rec("a", 1.0)])
    assert not (tmp_path / "x.json").exists()


def test_format_table_is_markdown_with_one_row_per_record():
    records = fill_ratios([_rec("base", 2.0), _rec("fast", 1.0)], "base")
    lines = format_table(records).splitlines()
    assert lines[0].startswith("| bench | pass | shape | name |") and lines[1].startswith("|---|")
    assert len(lines) == 4
    assert "| fast |" in lines[3] and "0.50x base" in lines[3] and "tokens=8" in lines[3]
