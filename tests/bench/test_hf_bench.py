"""``attnlab bench hf`` on the default small random Llama at tiny lengths: records, ratios,
summary, JSON, CLI. No timing upper bounds (a loaded machine may stall any call)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

import attnlab.hf  # noqa: E402
from attnlab.bench import hf  # noqa: E402
from attnlab.cli import main  # noqa: E402
from attnlab.config import ConfigError  # noqa: E402
from attnlab.results import read_json, read_summary  # noqa: E402

SEA = {"name": "sea", "k": 4, "predictor_length": 8}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "hf.json"
    records = hf.run(cores=[SEA, "performer"], seq_lens=[32, 16], new_tokens=2, json_path=path)
    return records, path


def test_original_and_converted_side_by_side_per_op_and_length(tiny_run):
    records, _ = tiny_run
    assert [(r.shape["seq_len"], r.shape["op"], r.name) for r in records] == [
        (t, op, name) for t in (16, 32) for op in ("forward", "generate")
        for name in ("original", "sea", "performer")
    ]
    base = {(r.shape["seq_len"], r.shape["op"]): r for r in records if r.name == "original"}
    for r in records:
        assert r.bench == "hf" and r.pass_ == "fwd" and r.baseline == "original"
        assert r.shape["model"] == hf.TINY_MODEL and r.shape["batch"] == 1
        assert ("new_tokens" in r.shape) == (r.shape["op"] == "generate")
        assert r.ratio == pytest.approx(
            r.ms_median / base[r.shape["seq_len"], r.shape["op"]].ms_median)
        assert 0 < r.ms_min <= r.ms_median and r.peak_mem_mb >= 0
    assert next(r for r in records if r.name == "sea").shape["options"] == {
        "k": 4, "predictor_length": 8}


def test_json_and_summary(tiny_run):
    records, path = tiny_run
    machine, back = read_json(path)
    assert back == records and machine["threads"] >= 1
    summary = read_summary(path)
    assert set(summary["generate_tokens_per_s"]) == {"original", "sea", "performer"}
    assert all(set(v) == {"16", "32"} and min(v.values()) > 0
               for v in summary["generate_tokens_per_s"].values())
    assert "| 16 |" in hf.format_summary(records)


def test_bad_input():
    with pytest.raises(ConfigError, match="unknown"):
        hf.run(cores=["flash"], seq_lens=[16], new_tokens=1)
    with pytest.raises(ConfigError, match="distinct"):
        hf.run(cores=["sea", "sea"], seq_lens=[16], new_tokens=1)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        hf.run(cores=["performer"], seq_lens=[10**5], new_tokens=1)


def test_cli(tmp_path, capsys):
    path = tmp_path / "hf.json"
    assert main(["bench", "hf", "--core", "performer", "--seq-lens", "16", "--new-tokens", "1",
                 "--json", str(path)]) == 0
    assert "generate tok/s" in capsys.readouterr().out
    assert {r["name"] for r in json.loads(path.read_text())["results"]} == {"original",
                                                                            "performer"}


def test_one_core_with_two_option_sets_gets_two_names():
    specs = hf.core_specs([{"name": "window", "window": 8}, {"name": "window", "window": 16},
                           "sdpa"])
    assert hf.model_names(specs) == ["window(window=8)", "window(window=16)", "sdpa"]
    models = hf.side_by_side(hf.tiny_llama(), specs)
    assert list(models) == ["original", "window(window=8)", "window(window=16)", "sdpa"]
    assert [attnlab.hf.cores(m)[0].window for m in list(models.values())[1:3]] == [8, 16]
