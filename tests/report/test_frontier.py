"""The long-context frontier: quality records joined with serve speeds, table, plot, report."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from attnlab.report import build_report, collect
from attnlab.report.frontier import frontier_points, frontier_table, merged
from attnlab.report.frontier_plots import plot_frontier
from attnlab.results import Record, fill_ratios, write_json

FINGERPRINT = "0123456789ab"

OPTIONS = {"sea": {"k": 256, "predictor_length": 64},
           "window(sinks=4,window=252)": {"sinks": 4, "window": 252},
           "window(sinks=4,window=124)": {"sinks": 4, "window": 124}}


def serve_records(model="m", fingerprint=FINGERPRINT):
    """Records as ``attnlab bench serve`` writes them: ratios, then each core's options."""
    cells = [("original", "prefill", 100.0, 1), ("original", "decode", 10.0, 1),
             ("original", "decode", 20.0, 8), ("sea", "prefill", 80.0, 1),
             ("sea", "decode", 12.5, 1), ("window(sinks=4,window=252)", "decode", 5.0, 1),
             ("window(sinks=4,window=124)", "decode", 4.0, 1)]
    records = [Record("serve", name, "fwd", {"model": model, "model_sha256": fingerprint,
                                             "op": op, "seq_len": 2048, "batch": batch,
                                             "dtype": "float32"}, ms, ms, 100.0)
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
    return {"bench": "long-context", "model": "m", "model_sha256": FINGERPRINT,
            "variants": variants, "records": records, "config": {}}


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
    assert "| 2048 | window 256 | 256 | 1.300 | 4/8* | 2.00 | - |" in table
    assert "inconclusive" in table  # 4 prompts per depth


def test_page_sizes_keep_their_own_speed_and_another_engine_is_left_out():
    cells = [("original", 10.0, {}), ("sea_pages(page=16)", 8.0, {"budget": 256}),
             ("sea_pages(page=8)", 5.0, {"budget": 256, "page": 8}), ("llama.cpp", 2.0, {})]
    serve = [Record("serve", name, "fwd", {"model": "m", "model_sha256": FINGERPRINT,
                                           "op": "decode", "seq_len": 2048, "batch": 1,
                                           "dtype": "float32"}, ms, ms, None)
             for name, ms, _ in cells]
    fill_ratios(serve, "original")
    for r, (_, _, options) in zip(serve, cells, strict=True):
        r.shape["options"] = options
    result = long_context_result()
    result["variants"] = [result["variants"][0],
                          {"label": "sea_pages 256", "core": "sea_pages",
                           "options": {"budget": 256, "estimators": "e16"}, "keys_per_row": 256},
                          {"label": "sea_pages p8 256", "core": "sea_pages",
                           "options": {"budget": 256, "page": 8, "estimators": "e8"},
                           "keys_per_row": 256}]
    result["records"] = [{"variant": v["label"], "seq_len": 2048, "task": "perplexity",
                          "ppl_ratio": 1.0} for v in result["variants"]]
    points = {p["variant"]: p for p in frontier_points(result, serve)}
    assert points["sea_pages 256"]["decode_speedup"] == pytest.approx(10 / 8)
    assert points["sea_pages p8 256"]["decode_speedup"] == pytest.approx(10 / 5)


def test_passkey_protocols_stay_apart():
    result = long_context_result()
    extra = [{**r, "protocol": "dense-prefill", "correct": 4, "accuracy": 1.0}
             for r in result["records"] if r["task"] == "passkey"]
    result["records"] += extra  # the same cells under Quest's protocol: every answer right
    points = {p["variant"]: p for p in frontier_points(result, SERVE)}
    sea = points["sea student 256"]
    assert sea["passkey_protocol"] == "dense-prefill" and sea["passkey"] == 1.0
    assert (sea["correct"], sea["passkey_prompts"]) == (8, 8)  # not 15 of 16
    assert sea["passkey_by_protocol"]["sparse"]["correct"] == 7
    table = frontier_table(list(points.values()))
    assert "| 2048 | sea student 256 | 256 | 1.050 | 8/8* dense-prefill; 7/8* sparse |" in table
    for r in extra:  # the first protocol's cells sure, the other's starred: still explained
        r["inconclusive"] = False
    table = frontier_table(frontier_points(result, SERVE))
    assert "8/8 dense-prefill; 7/8* sparse" in table and "\\* inconclusive" in table


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


def test_the_plot_draws_what_was_measured_and_labels_what_tells_variants_apart(monkeypatch,
                                                                             tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    labels, lines = [], []
    monkeypatch.setattr(matplotlib.axes.Axes, "annotate",
                        lambda self, text, *a, **k: labels.append(text))
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline",
                        lambda self, y, *a, **k: lines.append((y, k.get("label"))))
    points = [{"variant": "original", "core": "original", "keys_per_row": None,
               "seq_len": 2048, "ppl_ratio": 1.0, "decode_speedup": 1.0},
              {"variant": "sea_pages p8 256", "core": "sea_pages", "keys_per_row": 256,
               "seq_len": 2048, "ppl_ratio": 1.05, "decode_speedup": 1.3},
              {"variant": "oracle 256", "core": "oracle", "keys_per_row": 256,
               "seq_len": 2048, "ppl_ratio": 1.02},
              {"variant": "quest 128", "core": "quest", "keys_per_row": 128,
               "seq_len": 2048, "ppl_ratio": 1.4}]
    plot_frontier(points, 2048, tmp_path / "f.png")
    assert labels == ["all", "p8 256"]
    # quest 128 has no speed: not drawn, counted in the title; the oracle's line is named
    # in the legend, where lines close together cannot hide each other's names
    assert lines == [(1.02, "oracle 256: 1.020 (most attention kept, never timed)")]


def test_passkey_points_of_mixed_protocols_say_their_protocol(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    labels = []
    monkeypatch.setattr(matplotlib.axes.Axes, "annotate",
                        lambda self, text, *a, **k: labels.append(text))
    points = [{"variant": "original", "core": "original", "keys_per_row": None,
               "seq_len": 2048, "passkey": 1.0, "passkey_protocol": "dense-prefill",
               "decode_speedup": 1.0},
              {"variant": "sea_pages p8 256", "core": "sea_pages", "keys_per_row": 256,
               "seq_len": 2048, "passkey": 0.9, "passkey_protocol": "sparse",
               "decode_speedup": 1.3}]
    plot_frontier(points, 2048, tmp_path / "f.png")
    assert labels == ["all (dense-prefill)", "p8 256 (sparse)"]
    labels.clear()
    plot_frontier(points[:1], 2048, tmp_path / "g.png")
    assert labels == ["all"]  # one protocol: the axis says it


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


def test_serve_records_of_another_model_are_never_joined():
    other = serve_records("other", "fedcba987654")
    with pytest.raises(ValueError, match="`other` .*cannot give the speed of `m`"):
        frontier_points(long_context_result(), other)
    unrecorded = serve_records(fingerprint=None)  # a file written before fingerprints
    with pytest.raises(ValueError, match="not recorded"):
        frontier_points(long_context_result(), unrecorded)
    with pytest.raises(ValueError, match="not recorded"):  # nor a result without one
        frontier_points({**long_context_result(), "model_sha256": None}, SERVE)
    old_other = serve_records("dir/other.gguf", fingerprint=None)
    with pytest.raises(ValueError, match="other.gguf"):  # both old, another file name
        frontier_points({**long_context_result(), "model": "x/m.gguf", "model_sha256": None},
                        old_other)


def test_files_from_before_fingerprints_join_by_file_name_and_say_so(tmp_path):
    old = {**long_context_result(), "model": "venv/pkg/m.gguf", "model_sha256": None}
    (tmp_path / "lc.json").write_text(json.dumps(old))
    write_json(tmp_path / "serve.json", serve_records("pkg/m.gguf", fingerprint=None))
    results = build_report(collect([tmp_path / "lc.json", tmp_path / "serve.json"]),
                           tmp_path / "out")
    assert any(p.get("decode_speedup") for p in results["frontier"])
    report = (tmp_path / "out" / "report.md").read_text()
    assert "joined by the model's file name only (`m.gguf`)" in report


def test_the_report_leaves_out_another_models_speed_loudly(tmp_path, caplog):
    (tmp_path / "lc.json").write_text(json.dumps(long_context_result()))
    write_json(tmp_path / "serve.json", serve_records("other", "fedcba987654"))
    with caplog.at_level(logging.WARNING, logger="attnlab.report.frontier"):
        results = build_report(collect([tmp_path / "lc.json", tmp_path / "serve.json"]),
                               tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "**Warning**: the serve records of `other` (fingerprint `fedcba987654`) are not " \
           "this model's" in report
    assert "no speed axis" in report and "frontier-2048.png" not in report
    assert any("not this model's" in r.message for r in caplog.records)
    assert all("decode_speedup" not in p and "prefill_speedup" not in p
               for p in results["frontier"])
    assert "Model: `other` (fingerprint `fedcba987654`)." in report  # its own serve table


def test_runs_of_one_path_with_other_files_stay_apart_and_serve_files_are_per_model(tmp_path):
    first = long_context_result()
    changed = {**first, "model_sha256": "fedcba987654"}  # the folder's files changed
    assert [m["model_sha256"] for m in merged([first, changed])] == [FINGERPRINT,
                                                                      "fedcba987654"]
    write_json(tmp_path / "a.json", SERVE)
    write_json(tmp_path / "b.json", [dataclasses.replace(r) for r in SERVE])
    with pytest.raises(ValueError, match="one file per model"):
        collect([tmp_path / "a.json", tmp_path / "b.json"])
    write_json(tmp_path / "b.json", serve_records("other", "fedcba987654"))
    assert len(collect([tmp_path / "a.json", tmp_path / "b.json"]).other) == 2 * len(SERVE)


def test_two_models_get_their_own_frontier_figures(tmp_path):
    pytest.importorskip("matplotlib")
    other = {**long_context_result(), "model": "n", "model_sha256": "fedcba987654"}
    (tmp_path / "a.json").write_text(json.dumps(long_context_result()))
    (tmp_path / "b.json").write_text(json.dumps(other))
    write_json(tmp_path / "serve-a.json", SERVE)
    write_json(tmp_path / "serve-b.json", serve_records("n", "fedcba987654"))
    results = build_report(collect(sorted(tmp_path.glob("*.json"))), tmp_path / "report")
    assert {"frontier-1-2048", "frontier-2-2048"} <= set(results["figures"])
    assert all(p.get("decode_speedup") for p in results["frontier"] if p["variant"] ==
               "sea student 256")  # each model joined with its own serve file


def budget_result():
    """Quest and the window at two budgets, one oracle point, with intervals."""
    variants = [{"label": "original", "core": "original", "options": {}, "keys_per_row": None}]
    records = [{"variant": "original", "task": "perplexity", "seq_len": 8192, "budget": None,
                "keys_per_row": None, "ppl": 20.0, "ppl_ratio": 1.0}]
    for core, budget, ratio in [("quest", 256, 1.2), ("quest", 1024, 1.05),
                                ("window", 256, 1.4), ("window", 1024, 1.1),
                                ("oracle", 256, 1.02), ("oracle p16", 256, 1.08),
                                ("oracle p16", 1024, 1.01)]:
        label = f"{core} {budget}"
        variants.append({"label": label, "core": core.split()[0], "options": {},
                         "keys_per_row": budget})
        records.append({"variant": label, "task": "perplexity", "seq_len": 8192,
                        "budget": budget, "keys_per_row": budget, "ppl": 20 * ratio,
                        "ppl_ratio": ratio, "ppl_ratio_ci95": [ratio - 0.01, ratio + 0.02]})
    return {"bench": "long-context", "model": "m", "model_sha256": FINGERPRINT,
            "variants": variants, "records": records, "config": {}}


def test_quality_against_budget_has_one_curve_per_variant_of_several_budgets(tmp_path):
    from attnlab.report.frontier import budget_curves

    result = budget_result()
    curves = budget_curves(result["records"], 8192)
    # the key-level oracle has one budget: no curve; the page oracle is a curve of its own
    assert set(curves) == {"quest", "window", "oracle p16"}
    assert curves["quest"] == [(256, 1.2, [1.19, 1.22]), (1024, 1.05, [1.04, 1.07])]
    pytest.importorskip("matplotlib")
    (tmp_path / "lc.json").write_text(json.dumps(result))
    build_report(collect([tmp_path / "lc.json"]), tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "![quality against budget at 8192](budget-8192.png)" in report
    assert (tmp_path / "report" / "budget-8192.png").stat().st_size > 10_000


def test_runs_that_each_measured_the_original_alike_keep_it_once():
    full = long_context_result()
    ppl = [r for r in full["records"] if r["task"] == "perplexity"]
    first = {**full, "variants": full["variants"][:2], "records": ppl[:2]}
    second = {**full, "variants": [full["variants"][0], full["variants"][2]],
              "records": [ppl[0], ppl[2]]}
    (one,) = merged([first, second])
    assert [r["variant"] for r in one["records"]] == ["original", "sea student 256",
                                                      "window 256"]
    other_original = {**second, "records": [{**ppl[0], "ppl": 99.0}, ppl[2]]}
    with pytest.raises(ValueError, match="original perplexity at 2048 tokens is in two"):
        merged([first, other_original])
