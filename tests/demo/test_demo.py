"""``attnlab demo``: the budget planner, and every stage end to end at smoke size (seconds)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import pytest

from attnlab.cli import main
from attnlab.config import builtin_config
from attnlab.demo import run as demo_run
from attnlab.demo.budget import Budget
from attnlab.demo.parallel import Run, RunFailed, measured_step_s, train_runs
from attnlab.demo.plan import (
    BUDGET_MINUTES,
    DISTILL_STEP_FACTORS,
    FULL,
    LAYERS,
    REAL_MODEL_MINUTES,
    SAFETY,
    SMOKE,
    SPEED_PROBE,
    STUDENTS,
    TRAINED,
    DistillCost,
    Lanes,
    bench_min_seconds,
    distill_seconds,
    plan_distill_steps,
    plan_train_steps,
    train_seconds,
)
from attnlab.demo.run import run_demo
from attnlab.demo.stages import train as train_stage
from attnlab.demo.stages.report import shortfalls
from attnlab.report import compact_table
from attnlab.results import read_json
from attnlab.train import RunDirError, load_run_config
from attnlab.utils.precision import native_bf16

PNG = b"\x89PNG\r\n\x1a\n"


def test_training_steps_fill_the_budget_equally():
    step_s = {"a": 0.5, "b": 0.25, "c": 0.25}
    steps = plan_train_steps(step_s, 1000.0, FULL, tokens_per_step=2048)
    evals = (FULL.evals * FULL.eval_tokens + FULL.final_eval_tokens) / 2048 / 3
    assert steps == int((SAFETY * 1000.0 - 3 * 3.0) / 1.0 - evals)
    assert plan_train_steps(step_s, 1.0, FULL, 2048, floor=7) == 7
    assert plan_train_steps(step_s, 1e9, FULL, 2048) == FULL.max_steps
    assert plan_train_steps(step_s, 1e9, SMOKE, 64) == SMOKE.max_steps
    # train_seconds inverts the planner
    assert plan_train_steps(step_s, train_seconds(step_s, 300, FULL, 2048) + 1e-6, FULL,
                            2048) == 300


def test_lanes_run_up_to_jobs_at_once_and_share_the_cores():
    assert Lanes().schedule([4, 3, 2, 1]) == [(0, 4), (4, 7), (7, 9), (9, 10)]
    assert Lanes(2, 2).schedule([4, 3, 2, 1]) == [(0, 4), (0, 3), (3, 5), (4, 5)]
    assert Lanes(4, 2).schedule([2, 2, 2, 2]) == [(0, 4)] * 4  # two cores for four runs


def test_training_two_at_a_time_plans_from_the_step_times_measured_that_way():
    """The published probe (bf16 models) alone, and 1.5x slower steps two at a time (the
    reference machine's first measurement): the pair plans more steps in the same seconds,
    and the planner still inverts :func:`train_seconds`."""
    alone = {"dense-h8": 0.2465, "dense-h8-rope": 0.1445, "dense-h2": 0.142,
             "switchhead": 0.134}
    together = {name: 1.5 * s for name, s in alone.items()}
    pair = Lanes(2, 2)
    steps = plan_train_steps(alone, 500.0, FULL, 2048)
    assert plan_train_steps(together, 500.0, FULL, 2048, lanes=pair) > 1.1 * steps
    assert plan_train_steps({n: 2.2 * s for n, s in alone.items()}, 500.0, FULL, 2048,
                            lanes=pair) < steps
    assert plan_train_steps(together, train_seconds(together, 300, FULL, 2048, pair) + 1e-6,
                            FULL, 2048, lanes=pair) == 300


def test_a_failed_run_says_its_error(tmp_path):
    occupied = tmp_path / "runs" / "taken"
    occupied.mkdir(parents=True)
    (occupied / "config.yaml").write_text("model: {}\n")
    cfg = load_run_config(builtin_config("tiny/dense-h2"), ["train.steps=1"])
    with pytest.raises(RunFailed, match=r"training taken failed \(exit code 1\): RunDirError: "
                                        ".* already holds a run"):
        train_runs([Run("taken", cfg, occupied, resume=False)], jobs=2, threads=1,
                   progress=False)
    assert (tmp_path / "runs" / "taken.log").is_file()


def test_the_measured_step_time_skips_the_start_up_window(tmp_path):
    cfg = load_run_config(builtin_config("tiny/dense-h2"))  # 16 x 128 tokens per step
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 10, "loss": 5.0, "tokens_per_s": 100.0},
        {"step": 10, "eval_loss": 4.0},
        {"step": 20, "loss": 4.0, "tokens_per_s": 1100.0},
        {"step": 30, "loss": 3.5, "tokens_per_s": 1024.0},
        {"step": 40, "loss": 3.2, "tokens_per_s": 900.0}]) + "\n{\"step\": 4")  # being written
    assert measured_step_s(tmp_path, cfg) == pytest.approx(2048 / 1024)
    assert Run("m", cfg, tmp_path, resume=True).progress()["step"] == 40
    assert measured_step_s(tmp_path / "none", cfg) is None


def test_distillation_steps_pay_for_the_teacher_and_the_evaluations():
    plain = DistillCost({"sea": 1.0}, 1.0, 2048, 8192, 32768, {})
    with_grid = dataclasses.replace(plain, grid={"sea": 9})
    steps = plan_distill_steps(plain, 600.0, FULL)
    assert steps == int((SAFETY * 600.0 - 3.0 - 2 * 16 / 3) / (DISTILL_STEP_FACTORS["sea"] + 0.5))
    assert set(DISTILL_STEP_FACTORS) == set(STUDENTS)
    assert plan_distill_steps(with_grid, 600.0, FULL) < steps
    # evaluations on the way (the convergence curve) and the grid's timing are paid for too
    with_evals = dataclasses.replace(plain, evals=4)
    assert distill_seconds(with_evals, 90) - distill_seconds(plain, 90) == pytest.approx(
        4 * 8192 / 2048 / 3 / SAFETY)
    timed = dataclasses.replace(with_grid, grid_reps=5, seq_len=256)
    assert distill_seconds(timed, 90) - distill_seconds(with_grid, 90) == pytest.approx(
        10 * 9 * 256 / 2048 / 3 / SAFETY)
    assert plan_distill_steps(plain, 1.0, FULL, floor=80) == 80
    assert plan_distill_steps(plain, distill_seconds(plain, 90) + 1e-6, FULL) == 90


def test_the_minimums_fit_the_reference_machine_in_the_default_budget():
    """With the published run's probe (docs/results/demo-cpu/probe.json, midpoints of median
    and fastest step, bf16 models), the default budget covers every stage's minimum with room
    to spare: a quiet reference machine needs no decision."""
    probe = {"dense-h8": 0.2465, "dense-h2": 0.142, "switchhead": 0.134, "dense-h8-rope": 0.1445,
             "sea": 0.803, "performer": 0.170}
    trained = {n: probe[n] for n in TRAINED}
    cost = DistillCost({n: probe[n] for n in STUDENTS}, probe["dense-h8-rope"], 2048, 8192,
                       32768, {"sea": 9}, evals=FULL.distill_evals, grid_reps=5, seq_len=256)
    needed = (train_seconds(trained, FULL.min_train_steps(2048), FULL, 2048)
              + distill_seconds(cost, FULL.min_distill_steps)
              + bench_min_seconds(FULL, probe[SPEED_PROBE], cuda=False) + FULL.report_reserve_s)
    assert needed < 0.8 * (BUDGET_MINUTES * 60 - 20)  # 20 s: the probe
    assert SPEED_PROBE in STUDENTS  # probed in float32, as the benchmark runs


@pytest.fixture(scope="module")
def smoke_demo(tmp_path_factory):
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("demo") / "demo"
    assert main(["demo", "--smoke", "--quiet", "--train-jobs", "2", "--real-model", "on",
                 "--out", str(out)]) == 0
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
    assert "### Distillation convergence" in md  # evaluated on the way (SEA's Fig. 4b)
    assert "x time" in md and "x memory" in md  # the grid's costs (Table A.6)
    for name in ("quality.png", "scaling-attention-layer.png", "macs-vs-time.png",
                 "sea-dynamic-k.png", "distillation-convergence.png", "sea-costs.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 10_000, name
    plan = json.loads((out / "plan.json").read_text())
    assert plan["train_steps"] == SMOKE.max_steps and plan["distill_steps"] == 2


def test_the_real_model_stage_compares_sea_pages_with_quest_and_a_window(smoke_demo):
    real = SMOKE.real_model
    results = json.loads((smoke_demo / "results.json").read_text())
    assert results["demo"]["real_model"] == real.name
    curves = json.loads((real.estimators_dir(smoke_demo) / "curves.json").read_text())
    assert curves["bench"] == "distill-estimators" and curves["page"] == real.page == 4
    assert len(curves["layers"]) == curves["n_layers"] and curves["backbone_unchanged"]
    quality = json.loads(real.quality_path(smoke_demo).read_text())
    pages = f"p{real.page} {real.keys}"  # TINY's pages of 4 are named in the labels
    assert [r["variant"] for r in quality["records"]] == [
        "original", f"sea_pages {pages}", f"quest {pages}", f"window {real.keys}"]
    assert all(r["ppl_ratio"] > 0 for r in quality["records"])
    _, serve = read_json(real.serve_path(smoke_demo))
    assert {r.name for r in serve} == {"original", "window", "quest", "sea_pages"}
    assert {r.shape["op"] for r in serve} == {"prefill", "decode"}
    md = (smoke_demo / "report.md").read_text()
    assert "## Long context: quality kept against serving speed" in md
    assert "The real-model stage runs SEA's page selection (sea_pages" in md
    assert "| 64 | quest p4 16 | 16 |" in md and "| 64 | sea_pages p4 16 | 16 |" in md


def test_the_real_model_stage_reuses_its_estimators_and_compares_four_variants_at_one_budget(
        tmp_path, monkeypatch):
    """TINY distils its estimators in step 1 unless they are there; the quality step reads
    the original and three cores of the same keys per query token per KV head (sea_pages
    and Quest in pages of 4, the budget a whole number of pages)."""
    from attnlab.distill import estimators
    from attnlab.evals import long_context
    from attnlab.evals.variants import parse_variant

    real = SMOKE.real_model
    folder = real.estimators_dir(tmp_path)
    folder.mkdir(parents=True)
    (folder / "estimators.safetensors").write_bytes(b"")  # as left by an earlier run
    monkeypatch.setattr(estimators, "distill_estimators",
                        lambda *args, **kwargs: pytest.fail("distilled again"))
    real.distil(tmp_path, tmp_path / "model", progress=False)
    seen = []
    monkeypatch.setattr(long_context, "run", lambda model, variants, cfg, **kwargs:
                        seen.append((variants, cfg.lengths)))
    real.quality(tmp_path, tmp_path / "model", "cpu", progress=False)
    [(variants, lengths)] = seen
    parsed = [parse_variant(v) for v in variants]
    assert [v.label for v in parsed] == ["original", "sea_pages p4 16", "quest p4 16",
                                         "window 16"]
    assert [v.keys_per_row for v in parsed[1:]] == [real.keys] * 3 and lengths == (64,)
    assert parsed[1].options == {"budget": 16, "page": 4,
                                 "estimators": str(folder / "estimators.safetensors")}
    assert parsed[2].options == {"budget": 16, "page": 4}
    assert real.outputs(tmp_path) == [real.quality_path(tmp_path), real.serve_path(tmp_path)]


def test_the_smollm2_stage_distils_nothing_and_reads_the_shipped_estimators(tmp_path):
    from attnlab.evals.variants import parse_variant
    from attnlab.layers.estimator_file import shipped

    real = FULL.real_model
    assert real.estimators == "smollm2-135m" and not real.estimator_overrides
    real.distil(tmp_path, tmp_path / "model", progress=False)  # nothing to do
    assert not (tmp_path / "runs").exists()
    variants = real.variants(tmp_path)
    assert variants[1] == {"name": "sea_pages", "budget": 256, "page": 16,
                           "estimators": "smollm2-135m"}
    if "smollm2-135m" not in shipped():
        local = dataclasses.replace(real, package=None, gguf_file=None)  # whatever is installed
        assert "the shipped estimators smollm2-135m" in local.missing()  # the stage says why
        pytest.skip("src/attnlab/estimators/smollm2-135m.safetensors is not shipped yet")
    parsed = [parse_variant(v) for v in variants]
    assert [v.label for v in parsed] == ["original", "sea_pages 256", "quest 256",
                                         "window 256"]


def test_the_real_model_stage_runs_from_its_budget_and_says_why_not(tmp_path):
    def real(budget_minutes, choice="auto", scale=FULL):
        return demo_run.Demo(tmp_path, scale, Budget(budget_minutes * 60), "cpu",
                             progress=False, real_model=choice)

    assert real(BUDGET_MINUTES).real is None
    assert "needs --budget-minutes 45 (or --real-model on)" in real(BUDGET_MINUTES).real_note
    assert real(REAL_MODEL_MINUTES, "off").real is None
    missing = dataclasses.replace(FULL, real_model=dataclasses.replace(
        FULL.real_model, package="attnlab_no_such_package"))
    assert "attnlab_no_such_package (the model's weights) is not installed" in real(
        REAL_MODEL_MINUTES, scale=missing).real_note
    with pytest.raises(ValueError, match="cannot run: package attnlab_no_such_package"):
        real(REAL_MODEL_MINUTES, "on", missing)
    with pytest.raises(ValueError, match="real_model must be one of auto, on, off"):
        real(REAL_MODEL_MINUTES, "yes")
    if FULL.real_model.missing() is None:  # SmolLM2 installed, as in environment.md
        assert real(REAL_MODEL_MINUTES).real == FULL.real_model


def test_the_models_train_two_at_a_time_each_in_its_own_process(smoke_demo):
    plan = json.loads((smoke_demo / "plan.json").read_text())
    assert plan["train_jobs"] == 2 and plan["train_threads"] >= 1  # --train-jobs 2
    choice = plan["lanes_choice"]
    assert choice["together"] and choice["alone_s_per_100_steps"] > 0
    assert choice["together_s_per_100_steps"] > 0
    assert sorted(choice["together_step_s"]) == sorted(TRAINED)
    assert not list(smoke_demo.glob("tmp*"))  # the second probe's files are gone
    replanned = plan["replanned"]  # after the warm-up of the first model of each lane
    assert replanned["at_step"] == plan["warmup_steps"] and replanned["pace"] > 0
    assert len(replanned["measured_step_s"]) == 2
    assert "The training steps were re-planned after the first" in (
        smoke_demo / "report.md").read_text()
    demo = json.loads((smoke_demo / "demo.json").read_text())["demo"]
    assert set(demo["runs_s"]) == set(TRAINED) and "training" in demo["stages_s"]
    for name in TRAINED:
        summary = json.loads((smoke_demo / "runs" / name / "summary.json").read_text())
        assert summary["steps"] == SMOKE.max_steps
        assert "model:" in (smoke_demo / "runs" / f"{name}.log").read_text()
        cfg = load_run_config(smoke_demo / "runs" / name / "config.yaml")
        assert cfg.train.threads == plan["train_threads"]
    assert "They train 2 at a time" in (smoke_demo / "report.md").read_text()


def test_the_models_train_in_the_precision_the_demo_records(smoke_demo):
    """``auto``: bf16 autocast where the CPU computes bf16 natively; the students distil in
    float32 whatever the models trained in."""
    precision = json.loads((smoke_demo / "demo.json").read_text())["demo"]["precision"]
    assert precision == ("bf16" if native_bf16("cpu") else "fp32")
    assert json.loads((smoke_demo / "plan.json").read_text())["precision"] == precision
    for name in TRAINED:
        cfg = load_run_config(smoke_demo / "runs" / name / "config.yaml")
        assert cfg.train.bf16 == (precision == "bf16"), name
    other = "fp32" if precision == "bf16" else "bf16"
    with pytest.raises(RunDirError, match=f"trained in {precision}; finish it with "
                                          f"--precision {precision}"):
        run_demo(smoke_demo, scale="smoke", progress=False, precision=other)
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16"):
        run_demo(smoke_demo / "never", scale="smoke", progress=False, precision="fp16")
    assert not (smoke_demo / "never").exists()


def test_a_rerun_refuses_options_other_than_the_plans(smoke_demo):
    """The fixture planned 2 models at a time without --strict-budget: a rerun asking for
    another arrangement would be recorded as it and run the plan's."""
    before = (smoke_demo / "plan.json").read_text()
    with pytest.raises(RunDirError, match="planned without --strict-budget"):
        run_demo(smoke_demo, scale="smoke", progress=False, strict_budget=True)
    with pytest.raises(RunDirError, match="trains 2 model.s. at a time; finish it with "
                                          "--train-jobs 2"):
        run_demo(smoke_demo, scale="smoke", progress=False, train_jobs=1)
    assert (smoke_demo / "plan.json").read_text() == before


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


def run_slow(tmp_path, monkeypatch, strict_budget=False, real_model="auto"):
    """A smoke demo whose every training run takes 400 s more than its steps: its clock jumps
    when a run starts (the probe, timed for real, knows nothing of it)."""
    pytest.importorskip("matplotlib")
    jump = [0.0]
    real_train = train_stage.train

    def slow_train(*args, **kwargs):
        jump[0] += 400.0
        return real_train(*args, **kwargs)

    monkeypatch.setattr(train_stage, "train", slow_train)
    out = tmp_path / "demo"
    results = run_demo(out, scale="smoke", progress=False, strict_budget=strict_budget,
                       train_jobs=1, real_model=real_model,
                       clock=lambda: time.perf_counter() + jump[0])
    return out, results, (out / "report.md").read_text()


def assert_every_stage_at_its_minimum_or_marked(out, results):
    plan = json.loads((out / "plan.json").read_text())
    marked = {f["stage"] for f in results["inconclusive"]}
    if plan["train_tokens"] < SMOKE.min_train_tokens:
        assert "training" in marked
    if plan["distill_steps"] < SMOKE.min_distill_steps:
        assert "distillation" in marked
    lengths = [r["shape"]["seq_len"] for r in
               results["scaling"]["attention-layer"]["records"] if r["ms_median"] is not None]
    if max(lengths) < SMOKE.min_seq_len:
        assert "benchmark" in marked
    return plan


def test_a_slow_machine_keeps_the_minimums_and_says_it_goes_over_budget(tmp_path, monkeypatch):
    out, results, md = run_slow(tmp_path, monkeypatch)
    plan = assert_every_stage_at_its_minimum_or_marked(out, results)
    assert plan["distill_steps"] == SMOKE.min_distill_steps and not results["inconclusive"]
    decisions = results["demo"]["decisions"]
    assert decisions and "over the budget by" in decisions[0], decisions
    assert "What the demo did when the time left could not cover every minimum" in md
    assert "INCONCLUSIVE" not in compact_table(results)


def test_a_strict_budget_marks_what_it_cuts_inconclusive(tmp_path, monkeypatch):
    out, results, md = run_slow(tmp_path, monkeypatch, strict_budget=True, real_model="on")
    plan = assert_every_stage_at_its_minimum_or_marked(out, results)
    assert plan["distill_steps"] == 1
    # the benchmark gets 1 s: whether it reaches its minimum depends on this machine
    assert {"distillation"} <= {f["stage"] for f in results["inconclusive"]} <= {
        "distillation", "benchmark"}
    assert "sea distilled 1 steps, below the 2 needed" in md and "sea (inconclusive)" in md
    assert all(r["inconclusive"] for r in results["students"])
    assert not any(r["inconclusive"] for r in results["headline"])
    assert "INCONCLUSIVE: performer distilled 1 steps" in compact_table(results)
    assert any(d.startswith("skipping the real-model stage (tiny-llama)")
               for d in results["demo"]["decisions"])
    assert "The real-model stage was skipped" in md
    assert not SMOKE.real_model.quality_path(out).exists()


def test_shortfalls_name_each_figure_below_its_minimum(smoke_demo):
    """Judged by the full demo's minimums, the smoke run's figures are all too small, and
    Performer is inconclusive even with enough steps (calibrated not to converge)."""
    demo = demo_run.Demo(smoke_demo, FULL, Budget(60.0), "cpu", progress=False)
    found = shortfalls(demo, {"train_tokens": 256, "distill_steps": 2})
    by_stage = {f["stage"]: f for f in found}
    assert "256 tokens, below the 400,000" in by_stage["training"]["reason"]
    assert "reached 64 tokens, below the 8192" in by_stage["benchmark"]["reason"]
    assert [f["names"] for f in found if f["stage"] == "distillation"] == [["sea"],
                                                                           ["performer"]]
    enough = shortfalls(demo, {"train_tokens": 400_000, "distill_steps": 80})
    assert [(f["stage"], f["names"]) for f in enough] == [
        ("distillation", ["performer"]), ("benchmark", list(LAYERS))]
    assert "performer had not converged after 80 steps" in enough[0]["reason"]
