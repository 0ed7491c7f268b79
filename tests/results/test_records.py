"""Benchmark records: the machine's facts, ratios, the JSON schema, Markdown tables."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.results import (
    Record,
    fill_ratios,
    format_table,
    machine_info,
    read_json,
    write_json,
)
from attnlab.utils.provenance import available_cores


def _rec(name, ms, pass_="fwd", tokens=8, bench="b"):
    return Record(bench, name, pass_, {"tokens": tokens}, ms, ms * 0.9, 1.5)


def test_machine_info_schema():
    info = machine_info()
    assert set(info) == {"cpu", "cores", "threads", "gpu", "torch", "malloc_tuned"}
    assert isinstance(info["cpu"], str) and info["cpu"]
    assert info["threads"] == torch.get_num_threads()
    assert info["cores"] == available_cores() >= 1
    assert info["gpu"] is None or isinstance(info["gpu"], str)
    assert info["torch"] == torch.__version__



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
