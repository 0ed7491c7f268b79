"""The long-context frontier: quality records joined with serve speeds, table, plot, report."""

from __future__ import annotations

import json

import pytest

from attnlab.bench.common import Record, fill_ratios, write_json
from attnlab.report import build_report, collect
from attnlab.report.frontier import frontier_points, frontier_table, merged, plot_frontier

OPTIONS = {"sea": {"k": 256, "predictor_length": 64},
           "window(sinks=4,window=252)": {"sinks": 4, "window": 252},
           "window(sinks=4,window=124)": {"sinks": 4, "window": 124}}


def serve_records():
    """Records as ``attnlab bench serve`` writes them: ratios, then each core's options."""
    cells = [("original", "prefill", 100.0, 1), ("original", "decode", 10.0, 1),
             ("original", "decode", 20.0, 8), ("sea", "prefill", 80.0, 1),
             ("sea", "decode", 12.5, 1), ("window(sinks=4,window=252)", "decode", 5.0, 1),
             ("window(sinks=4,window=124)", "decode", 4.0, 1)]
    records = [Record("serve", name, "fwd", {"model": "m", "op": op, "seq_len": 2048,
                                             "batch": batch, "dtype": "float32"}, ms, ms, 100.0)
               for name, op, ms, batch in cells]
    fill_ratios(records, "original")
    for r in records:
        if r.name in OPTIONS:
            r.shape["options"] = OPTIONS[r.name]
    return records


SERVE = serve_records()


def long_context_result():
    variants = [
        {"label": "original", "core": "original", "options": {}, "keys_per_row": None},
        {"label": "sea student 256", "core": "sea", "options": {"k": 256},
         "keys_per_row": 256, "student": "s", "trained_len": 1024},
        {"label": "window 256", "core": "window", "options": {"sinks": 4, "window": 252},
         "keys_per_row": 256},
        {"label": "oracle 256", "core": "oracle", "options": {"k": 256}, "keys_per_row": 256},
    ]
    records = []
    for v, ppl_ratio, correct in [("original", 1.0, (4, 4)), ("sea student 256", 1.05, (3, 4)),
                                  ("window 256", 1.3, (0, 4)), ("oracle 256", 1.01, (4, 4))]:
        keys = next(x["keys_per_row"] for x in variants if x["label"] == v)
        base = {"variant": v, "seq_len": 2048, "keys_per_row": keys}
        records.append({**base, "task": "perplexity", "ppl": 10 * ppl_ratio,
                        "ppl_ratio": ppl_ratio})
        for depth, c in zip((0.1, 0.9), correct, strict=True):
            records.append({**base, "task": "passkey", "depth": depth, "prompts": 4,
                            "correct": c, "accuracy": c / 4, "inconclusive": True})
    return {"bench": "long-context", "model": "m", "variants": variants, "records": records,
            "config": {}}


def test_points_join_quality_and_the_speed_of_the_same_core_and_budget():
    points = {p["variant"]: p for p in frontier_points(long_context_result(), SERVE)}
    sea = points["sea student 256"]
    assert sea["decode_speedup"] == pytest.approx(0.8)  # 10 ms / 12.5 ms, batch 1 only
    assert sea["prefill_speedup"] == pytest.approx(1.25)
    assert sea["ppl_ratio"] == 1.05 and sea["passkey"] == 7 / 8
    assert sea["passkey_ratio"] == pytest.approx(7 / 8)
    assert points["window 256"]["decode_speedup"] == pytest.approx(2.0)  # not the 124 one
    assert "prefill_speedup" not in points["window 256"]
    assert "decode_speedup" not in points["oracle 256"]  # not measured: no speed
    assert points["original"]["decode_speedup"] == 1.0
    table = frontier_table(list(points.values()))
    assert "| 2048 | window 256 | 256 | 1.300 | 4/8 | 2.00 | - |" in table


def test_the_plot_and_the_report_section(tmp_path):
    pytest.importorskip("matplotlib")
    points = frontier_points(long_context_result(), SERVE)
    assert plot_frontier(points, 2048, tmp_path / "f.png").stat().st_size > 10_000
    (tmp_path / "lc.json").write_text(json.dumps(long_context_result()))
    write_json(tmp_path / "serve.json", SERVE)
    results = build_report(collect([tmp_path / "lc.json", tmp_path / "serve.json"]),
                           tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Long context: quality kept against serving speed" in report
    assert "![frontier at 2048](frontier-2048.png)" in report
    assert (tmp_path / "report" / "frontier-2048.png").is_file()
    assert len(results["frontier"]) == 4


def test_runs_of_one_model_merge_and_a_cell_measured_twice_is_refused():
    full = long_context_result()
    ppl = {**full, "records": [r for r in full["records"] if r["task"] == "perplexity"]}
    passkey = {**full, "variants": full["variants"][:2],
               "records": [r for r in full["records"] if r["task"] == "passkey"]}
    (one,) = merged([ppl, passkey])
    assert len(one["variants"]) == 4 and len(one["records"]) == len(full["records"])
    with pytest.raises(ValueError, match="in two long-context runs"):
        merged([full, ppl])
    relabelled = {**passkey, "variants": [{**passkey["variants"][1], "options": {"k": 64}}]}
    with pytest.raises(ValueError, match="different specs"):
        merged([ppl, relabelled])
