"""``attnlab demo``: the budget planner, and every stage end to end at smoke size (seconds)."""

from __future__ import annotations

import json
import logging

import pytest

from attnlab.cli import main
from attnlab.demo.plan import (
    DISTILL_STEP_FACTOR,
    FULL,
    SAFETY,
    SMOKE,
    STUDENTS,
    TRAINED,
    plan_distill_steps,
    plan_train_steps,
)
from attnlab.demo.run import run_demo

PNG = b"\x89PNG\r\n\x1a\n"


def test_training_steps_fill_the_budget_equally():
    step_s = {"a": 0.5, "b": 0.25, "c": 0.25}
    steps = plan_train_steps(step_s, 1000.0, FULL, tokens_per_step=2048)
    evals = (FULL.evals * FULL.eval_tokens + FULL.final_eval_tokens) / 2048 / 3
    assert steps == int((SAFETY * 1000.0 - 3 * 3.0) / 1.0 - evals)
    assert plan_train_steps(step_s, 1.0, FULL, 2048) == FULL.min_steps
    assert plan_train_steps(step_s, 1e9, FULL, 2048) == FULL.max_steps
    assert plan_train_steps(step_s, 1e9, SMOKE, 64) == SMOKE.max_steps


def test_distillation_steps_pay_for_the_teacher_and_the_evaluations():
    plain = plan_distill_steps({"s": 1.0}, 1.0, 600.0, FULL, 2048, 8192, 32768, {})
    with_grid = plan_distill_steps({"s": 1.0}, 1.0, 600.0, FULL, 2048, 8192, 32768, {"s": 9})
    assert plain == int((SAFETY * 600.0 - 3.0 - 2 * 16 / 3) / (DISTILL_STEP_FACTOR + 0.5))
    assert with_grid < plain


@pytest.fixture(scope="module")
def smoke_demo(tmp_path_factory):
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("demo") / "demo"
    assert main(["demo", "--smoke", "--quiet", "--out", str(out)]) == 0
    return out


def test_smoke_demo_leaves_report_plots_and_json(smoke_demo, capsys):
    out = smoke_demo
    results = json.loads((out / "results.json").read_text())
    assert [r["model"] for r in results["headline"]] == list(TRAINED)
    assert all(r["side_by_side"] and r["step_ratio"] > 0 for r in results["headline"])
    assert [r["student"] for r in results["students"]] == list(STUDENTS)
    assert results["sea_grid"]["sea"] and results["demo"]["mode"] == "smoke"
    assert results["machine"]["threads"] >= 1 and "torch" in results["machine"]
    layers = results["scaling"]["attention-layer"]["records"]
    assert {r["name"] for r in layers} == {"sdpa", "eager", "switchhead", "sea", "performer",
                                           "reformer"}
    md = (out / "report.md").read_text()
    assert "## Is it faster in wall-clock, and at what quality?" in md
    for name in ("quality.png", "scaling-attention-layer.png", "macs-vs-time.png",
                 "sea-dynamic-k.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 10_000, name
    plan = json.loads((out / "plan.json").read_text())
    assert plan["train_steps"] == SMOKE.max_steps and plan["distill_steps"] == 2


def test_a_rerun_reuses_every_finished_stage(smoke_demo, caplog):
    summaries = {p: p.stat().st_mtime_ns for p in smoke_demo.glob("runs/*/summary.json")}
    probe = (smoke_demo / "probe.json").stat().st_mtime_ns
    (smoke_demo / "runs" / "performer" / "summary.json").unlink()  # as if interrupted there
    del summaries[smoke_demo / "runs" / "performer" / "summary.json"]
    with caplog.at_level(logging.INFO, logger="attnlab.demo"):
        results = run_demo(smoke_demo, scale="smoke", progress=False)
    assert (smoke_demo / "probe.json").stat().st_mtime_ns == probe
    assert all(p.stat().st_mtime_ns == t for p, t in summaries.items())
    assert "finished earlier" in caplog.text
    assert (smoke_demo / "runs" / "performer" / "summary.json").is_file()
    assert [r["student"] for r in results["students"]] == list(STUDENTS)
