"""``attnlab bench attention`` at tiny sizes: records, ratios, memory guard, summary, plot, CLI.
No timing upper bounds (a loaded machine may stall any call)."""

from __future__ import annotations

import json
import math
import sys
import time

import pytest
import torch

from attnlab.bench import attention
from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.results import Record, fill_ratios, format_table, read_json, read_summary, scaling

MECHS = ["sdpa", "eager", "performer", "reformer"]
TINY = {"heads": 2, "d_head": 8, "reps": 5}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "attention.json"
    records = attention.run(MECHS, [64, 32], json_path=path, **TINY)
    return records, path


def test_one_record_per_mechanism_and_length_with_ratios_vs_sdpa(tiny_run):
    records, _ = tiny_run
    assert [(r.shape["seq_len"], r.name) for r in records] == [
        (t, m) for t in (32, 64) for m in MECHS
    ]
    sdpa = {r.shape["seq_len"]: r for r in records if r.name == "sdpa"}
    for r in records:
        assert r.bench == "attention" and r.pass_ == "fwd" and r.skipped is None
        assert r.shape == {"seq_len": r.shape["seq_len"], "heads": 2, "d_head": 8, "batch": 1,
                           "causal": True, "dtype": "float32"}
        assert r.baseline == "sdpa"
        assert r.ratio == pytest.approx(r.ms_median / sdpa[r.shape["seq_len"]].ms_median)
        assert 0 < r.ms_min <= r.ms_median and r.peak_mem_mb >= 0


def test_json_round_trip_with_summary(tiny_run):
    records, path = tiny_run
    payload = json.loads(path.read_text())
    assert set(payload) == {"machine", "results", "summary"}
    assert all("skipped" not in r for r in payload["results"])  # schema unchanged when run
    machine, back = read_json(path)
    assert back == records and machine["threads"] >= 1
    summary = read_summary(path)
    assert set(summary["slopes"]) == set(MECHS)
    assert summary == json.loads(json.dumps(scaling.summarize(records)))
    assert summary["slopes_2k_16k"] == {}  # 2048 and 16384 not measured


def test_fwdbwd_bidirectional_adds_the_sdpa_baseline():
    records = attention.run(["eager", "reformer"], [16, 32], causal=False, pass_="fwdbwd",
                            **TINY)
    assert [r.name for r in records] == ["sdpa", "eager", "reformer"] * 2
    assert all(r.pass_ == "fwdbwd" and r.shape["causal"] is False for r in records)
    assert all(r.ratio > 0 for r in records)


def test_core_options_reach_the_core_and_are_recorded():
    specs = attention.core_specs(["sdpa", "reformer"], ["reformer.bucket_size=16"])
    core = attention.build_core(specs["reformer"], heads=2, d_head=8, seq_len=64, causal=True)
    assert core.bucket_size == 16
    records = attention.run(["reformer"], [32], options=["reformer.n_hashes=1"], **TINY)
    assert records[1].shape["options"] == {"n_hashes": 1}
    assert "options" not in records[0].shape  # sdpa got none


def test_a_labelled_copy_of_a_core_takes_its_own_options():
    specs = attention.core_specs(["quest", "quest@flex"], ["quest@flex.executor=flex"])
    assert specs["quest@flex"].name == "quest"
    assert specs["quest@flex"].options == {"executor": "flex"}
    assert specs["quest"].options == {}
    with pytest.raises(ConfigError, match="'window@' must look like CORE or CORE@LABEL"):
        attention.core_specs(["window@"])


@pytest.mark.parametrize("bad, match", [
    ("reformer.no_such_option=1", "no_such_option"),
    ("eager=1", "MECHANISM.OPTION=VALUE"),
    ("performer.n_features=4", "not a benchmarked mechanism"),
])
def test_bad_core_options_are_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        attention.core_specs(["sdpa", "reformer"], [bad])


def test_unknown_mechanism_lists_the_registered_cores():
    with pytest.raises(ConfigError, match="unknown core 'nosuch'") as err:
        attention.run(["sdpa", "nosuch"], [16], **TINY)
    assert all(m in str(err.value) for m in MECHS)


def test_unknown_mechanism_through_the_cli(capsys):
    assert main(["bench", "attention", "--mechanisms", "sdpa,nosuch", "--seq-lens", "16"]) == 2
    err = capsys.readouterr().err
    assert "unknown core 'nosuch'" in err and "registered:" in err and "performer" in err


def test_everything_skipped_under_a_tiny_memory_limit(tmp_path):
    path = tmp_path / "skipped.json"
    records = attention.run(["sdpa", "eager"], [16, 32], max_mem_gb=1e-9, json_path=path, **TINY)
    assert len(records) == 4
    for r in records:
        assert r.skipped and "GiB" in r.skipped and "--max-mem-gb" in r.skipped
        assert r.ms_median is None and r.peak_mem_mb is None and r.ratio is None
    results = json.loads(path.read_text())["results"]
    assert all(r["skipped"] and r["ratio"] is None for r in results)
    assert read_json(path)[1] == records
    assert "skipped: " in format_table(records)
    assert scaling.summarize(records)["slopes"] == {}
    assert "skipped" in scaling.format_summary(records)


def test_only_what_does_not_fit_is_skipped():
    # the budget sits between sdpa's and eager's peak at 1024 (eager: ~25x sdpa here)
    measured = attention.run(["sdpa", "eager"], [256, 1024], **TINY)
    mem = {r.name: r.peak_mem_mb for r in measured if r.shape["seq_len"] == 1024}
    budget_gb = math.sqrt(mem["sdpa"] * mem["eager"]) / 1024
    records = attention.run(["sdpa", "eager"], [256, 1024], max_mem_gb=budget_gb, **TINY)
    skipped = [(r.name, r.shape["seq_len"]) for r in records if r.skipped]
    assert skipped == [("eager", 1024)]
    assert records[-1].ratio is None and records[-2].ratio == 1.0
    assert set(scaling.summarize(records)["slopes"]) == {"sdpa"}  # eager has one length


def test_memory_extrapolation_is_exact_for_linear_plus_quadratic():
    def mem(t):
        return 3.0 * t + 0.5 * t * t

    assert attention.extrapolate_bytes([(8, 1.0), (64, mem(64)), (128, mem(128))], 4096) == (
        pytest.approx(mem(4096))
    )
    # falling quadratic term -> linear through the steeper point; never below the data
    assert attention.extrapolate_bytes([(100, 50.0), (200, 60.0)], 400) == pytest.approx(200.0)


def test_slopes_are_least_squares_log_log():
    def rec(name, t, ms):
        return Record("attention", name, "fwd", {"seq_len": t}, ms, ms, t / 1024)

    lengths = [1024, 2048, 4096, 8192, 16384]
    records = [rec("quad", t, (t / 1024) ** 2) for t in lengths]
    records += [rec("lin", t, t / 1024 * (1.5 if t == 1024 else 1.0)) for t in lengths]
    records += [rec("short", t, 1.0) for t in lengths[:3]]
    fill_ratios(records, "quad")
    summary = scaling.summarize(records)
    assert summary["slopes"]["quad"] == pytest.approx(2.0)
    assert summary["slopes_2k_16k"] == {"quad": pytest.approx(2.0), "lin": pytest.approx(1.0)}
    assert summary["slopes"]["lin"] < 1.0  # the slow 1024 point counts over all lengths
    assert summary["mem_slopes"]["short"] == pytest.approx(1.0)


def test_fill_ratios_refuses_a_skipped_baseline():
    base = Record("attention", "sdpa", "fwd", {"seq_len": 8}, None, None, None, skipped="big")
    other = Record("attention", "eager", "fwd", {"seq_len": 8}, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="was skipped"):
        fill_ratios([base, other], "sdpa")


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plots" / "attention.png"
    attention.run(["sdpa", "eager"], [16, 32], plot_path=png, **TINY)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_fails_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setattr(attention, "time_side_by_side", pytest.fail)
    with pytest.raises(ImportError, match=r"attnlab\[plot\]"):
        attention.run(["sdpa"], [16], plot_path=tmp_path / "x.png", **TINY)
    capsys.readouterr()
    assert main(["bench", "attention", "--seq-lens", "16", "--plot",
                 str(tmp_path / "x.png")]) == 2
    assert "error: plots need matplotlib: pip install 'attnlab[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_cli_smoke(tmp_path, capsys):
    out = tmp_path / "attention.json"
    assert main(["bench", "attention", "--mechanisms", "sdpa,performer", "--seq-lens", "16,32",
                 "--heads", "2", "--d-head", "8", "--reps", "5", "--bidirectional", "--pass",
                 "fwdbwd", "--set", "performer.n_features=4", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["name"], r["shape"]["seq_len"]) for r in results] == [
        ("sdpa", 16), ("performer", 16), ("sdpa", 32), ("performer", 32)
    ]
    assert all(r["pass"] == "fwdbwd" and r["shape"]["causal"] is False for r in results)
    assert results[1]["shape"]["options"] == {"n_features": 4}
    printed = capsys.readouterr().out
    assert "| attention | fwdbwd |" in printed and "log-log slope" in printed
    assert f"saved {out}" in printed


def _layer_model(**attention):
    from attnlab.models import ModelConfig

    return ModelConfig(d_model=16, n_layers=1, d_ff=32, max_seq_len=64,
                       attention={"n_heads": 2, "d_head": 8, **attention})


def test_attention_layers_side_by_side_with_macs(tmp_path):
    models = {"sdpa": _layer_model(),
              "switchhead": _layer_model(projections={"name": "switchhead", "n_experts": 2,
                                                      "k": 1}),
              "performer": _layer_model(core="performer")}
    path = tmp_path / "layers.json"
    records = attention.run_layers(models, [32, 16], reps=5, json_path=path)
    assert [(r.shape["seq_len"], r.name) for r in records] == [
        (t, m) for t in (16, 32) for m in models]
    assert all(r.bench == "attention-layer" and r.baseline == "sdpa" for r in records)
    base = {r.shape["seq_len"]: r.ms_median for r in records if r.name == "sdpa"}
    for r in records:
        assert r.ratio == pytest.approx(r.ms_median / base[r.shape["seq_len"]])
        assert r.shape["attention"]["n_heads"] == 2 and r.shape["d_model"] == 16
    macs = {(r.name, r.shape["seq_len"]): r.shape["macs"] for r in records}
    assert macs["sdpa", 32] > macs["sdpa", 16] > 0 and macs["performer", 16] is None
    assert read_json(path)[1] == records


def test_attention_layers_stop_at_the_time_budget():
    records = attention.run_layers({"sdpa": _layer_model()}, [8, 16, 32], reps=5,
                                   time_budget_s=0.0)
    assert [r.shape["seq_len"] for r in records] == [8]  # the first length always runs


def test_the_time_budget_counts_only_what_the_memory_guard_keeps(monkeypatch):
    """A slow mechanism skipped for memory at the next length does not stop that length."""
    memory = {"fast": lambda t: t, "slow": lambda t: t * t}  # MiB at length t

    def prepared(t):
        def call(name):
            def run():
                if name == "slow":
                    time.sleep(0.04)
            run.mib = memory[name](t)
            return run
        return {name: call(name) for name in memory}

    monkeypatch.setattr(attention, "peak_memory_mb", lambda fn, device: fn.mib)
    records = attention.measure_lengths(
        ["fast", "slow"], [16, 32, 64], prepared, bench="b", baseline="fast", pass_="fwd",
        reps=5, mem_budget=600 * 2**20, inputs_bytes=lambda t: 0, shape=lambda t: {"t": t},
        device=torch.device("cpu"), time_budget_s=0.8)  # slow at 16: ~0.25 s; x4 > 0.8
    assert [(r.shape["t"], r.name, r.skipped is None) for r in records] == [
        (16, "fast", True), (16, "slow", True), (32, "fast", True), (32, "slow", False),
        (64, "fast", True), (64, "slow", False)]
