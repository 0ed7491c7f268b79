"""The full report (``attnlab report``) from tiny fixture runs and bench files."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main
from attnlab.report import build_report, collect, compact_table
from attnlab.report.figures import crossovers, step_reaching
from tests.report.fixtures import (
    fake_run,
    fake_scaling,
    fake_step_times,
    fake_student,
)

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def inputs(tmp_path):
    runs = tmp_path / "runs"
    fake_run(runs / "switch", [(10, 2.9), (20, 2.5), (30, 2.3)])
    fake_run(runs / "dense", [(10, 3.0), (20, 2.6), (30, 2.4)], params=1001)
    fake_student(runs / "sea", teacher=runs / "dense")
    fake_step_times(tmp_path / "probe.json", {"dense": 10.0, "switch": 5.0, "sea": 40.0})
    fake_scaling(tmp_path / "layers.json", {"sdpa": [1.0, 4.0, 16.0], "sea": [8.0, 3.0, 9.0],
                                            "eager": [2.0, 8.0, 32.0]}, [256, 512, 1024])
    return tmp_path


def test_report_tables_figures_and_json(inputs):
    pytest.importorskip("matplotlib")
    out = inputs / "report"
    results = build_report(collect([inputs]), out, title="fixture")
    md = (out / "report.md").read_text()
    # headline: the probe's first record is the baseline and comes first; switch takes half the
    # step time and reaches dense's final 2.4 at step 25: 0.125 s vs 0.3 s
    assert "| dense | 1,001 | 1,920 | 2.400 | 10 | 1.00 | 0.3 | 0.3 | 1.00 | 10 | 3.0 |" in md
    assert "| switch | 1,000 | 1,920 | 2.300 | 5 | 0.50 | 0.1 | 0.1 | 0.42 | 10 | 3.0 |" in md
    switch = results["headline"][1]
    assert switch["model"] == "switch" and switch["reach_ratio"] == pytest.approx(0.125 / 0.3)
    # students: teacher vs student, step times of both from the probe
    assert "| sea | dense | 6 | 5.500 | 6.050 | 1.10 | 2.400 | 2.500 | 40 | 4.00 |" in md
    assert "| sea: k \\ query skip | 1 | 2 |" in md
    assert "| 4 | 6.100 (2.250) | 6.200 (2.250) |" in md
    # scaling: the core tables, and where each mechanism wins or loses
    assert "| 1024 | 16.0 (1.00x) | 9.0 (0.56x) | 32.0 (2.00x) |" in md
    assert "**sea** is faster than sdpa from 512 tokens on (0.56x at 1024)" in md
    assert "**eager** is slower than sdpa at every measured length (256-1024)" in md
    assert "| attention-layer | sdpa | 1024 | 104.9 | 16.00 | 1.00 |" in md  # MACs vs time
    for name in ("quality.png", "sea-dynamic-k.png", "scaling-attention-layer.png",
                 "macs-vs-time.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 10_000, name
        assert f"]({name})" in md
    saved = json.loads((out / "results.json").read_text())
    assert saved["machine"]["threads"] >= 1 and set(saved["runs"]) == {"dense", "switch"}
    assert saved["scaling"]["attention-layer"]["crossovers"]["sea"]["faster_from"] == 512
    assert saved["sea_grid"]["sea"][0] == {"k": 2, "query_skip": 1, "ppl": 7.1, "bpc": 2.5}
    assert "switch" in compact_table(results)


def test_students_of_one_teacher_get_distillation_convergence_curves(tmp_path):
    """SEA's Fig. 4b: each student's held-out perplexity during distillation, against
    tokens and its own training time, in a table and a plot."""
    pytest.importorskip("matplotlib")
    teacher = fake_run(tmp_path / "runs" / "dense", [(10, 3.0)])
    fake_student(tmp_path / "runs" / "sea", teacher)
    fake_student(tmp_path / "runs" / "performer", teacher, grid=False, core="performer",
                 curve=((2, 9.0), (4, 8.0), (6, 7.5)))
    out = tmp_path / "report"
    build_report(collect([tmp_path / "runs"]), out)
    md = (out / "report.md").read_text()
    assert "### Distillation convergence" in md
    assert "| performer | 0 | 9.000 | 8.000 | 7.500 |" in md
    assert "| sea | 0 | 7.000 | 6.500 | 6.050 |" in md
    data = (out / "distillation-convergence.png").read_bytes()
    assert data[:8] == PNG and len(data) > 10_000


def test_cli_builds_the_report_and_rejects_bad_input(inputs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    assert main(["report", str(inputs / "runs" / "dense"), str(inputs / "probe.json"),
                 "--out", str(out)]) == 0
    assert "dense" in capsys.readouterr().out and (out / "report.md").is_file()
    assert (out / "quality.png").read_bytes()[:8] == PNG
    assert main(["report", str(inputs / "probe.json"), str(inputs / "probe.json"),
                 "--out", str(out)]) == 2
    assert "a second set of 'train' bench records" in capsys.readouterr().err
    (tmp_path / "other.json").write_text("{}")
    assert main(["report", str(tmp_path / "other.json"), "--out", str(out)]) == 2
    assert "not a bench JSON file" in capsys.readouterr().err


def test_without_step_times_the_runs_own_time_is_used_and_no_ratio(inputs):
    found = collect([inputs / "runs" / "dense", inputs / "runs" / "switch"])
    rows = build_report(found, inputs / "plain")["headline"]
    assert [r["step_ratio"] for r in rows] == [None, None]
    assert rows[0]["train_s"] == pytest.approx(3.0)  # 1920 tokens at 640 tokens/s
    assert "separate runs" in (inputs / "plain" / "report.md").read_text()


def test_step_reaching_and_crossovers():
    assert step_reaching([(10, 3.0), (20, 2.0)], 2.5) == pytest.approx(15)
    assert step_reaching([(10, 3.0)], 3.5) == 10 and step_reaching([(10, 3.0)], 2.0) is None
    from attnlab.results import Record

    recs = [Record("attention", "x", "fwd", {"seq_len": t}, ms, ms, 1.0, "sdpa", ms)
            for t, ms in ((1, 0.5), (2, 1.5), (4, 0.8))]
    assert crossovers(recs)["x"]["faster_from"] == 4
    assert crossovers(recs)["x"]["worst_at"] == 2


def test_sea_grid_with_costs_is_a_table_and_heatmaps(tmp_path):
    """SEA's Table A.6: perplexity with each setting's time and memory against the teacher."""
    pytest.importorskip("matplotlib")
    teacher = fake_run(tmp_path / "runs" / "dense", [(10, 3.0)])
    fake_student(tmp_path / "runs" / "sea", teacher, costs=True)
    out = tmp_path / "report"
    build_report(collect([tmp_path / "runs"]), out)
    md = (out / "report.md").read_text()
    assert "| 8 | 5.600 (2.125); 0.90x time, 0.50x memory | 5.700 (2.125); 0.85x time, " \
           "0.50x memory |" in md
    assert "the teacher: 10.0 ms, 4.0 MiB peak" in md
    data = (out / "sea-costs.png").read_bytes()
    assert data[:8] == PNG and len(data) > 10_000 and "](sea-costs.png)" in md
