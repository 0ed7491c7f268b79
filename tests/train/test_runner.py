"""The run lifecycle shared by train and distill (:mod:`attnlab.train.runner`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from attnlab.config import ConfigError
from attnlab.distill import distill, load_distill_config
from attnlab.models import DecoderLM
from attnlab.train import RunDirError, RunInterrupted, TrainingDiverged, load_run_config, train
from attnlab.train.checkpoint import latest_checkpoint
from attnlab.train.run import load_run
from attnlab.train.runner import (
    Cadence,
    MetricsLog,
    RunFolder,
    Runner,
    StepResult,
)
from attnlab.train.schedules import warmup_constant, warmup_cosine
from tests.helpers import dump_config


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _runner(tmp_path, steps=10, saved=None, **cadence):
    folder = RunFolder(tmp_path / "run", "config.yaml", "run", resume=False)
    folder.create()
    saved = [] if saved is None else saved
    runner = Runner(
        folder, Cadence(steps, cadence.get("log_every", 2), cadence.get("eval_every", 4),
                        cadence.get("ckpt_every", 5)),
        tokens_per_step=8, save=lambda step, state: saved.append((step, dict(state))),
        evaluate=lambda: {"eval_loss": 1.5}, metrics=MetricsLog(folder.path, None),
        what="training", divergence_hint="Lower the rate.", progress=False)
    return runner, saved


def test_runner_logs_evaluates_and_checkpoints_on_its_cadence(tmp_path):
    runner, saved = _runner(tmp_path)
    assert runner.run(lambda step: StepResult({"loss": float(step)}, lr=0.1)) is True
    records = _records(runner.folder.path)
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == [2, 4, 6, 8, 10]
    assert train_records[0]["loss"] == 0.5  # the window's mean (steps 0 and 1)
    assert train_records[-1]["tokens"] == 80
    assert [r["step"] for r in records if "eval_loss" in r] == [4, 8]  # not at the end
    assert [step for step, _ in saved] == [5, 10]  # the end's checkpoint once, not twice
    assert saved[-1][1]["tokens"] == 80


def test_runner_pauses_and_restores(tmp_path):
    runner, saved = _runner(tmp_path, ckpt_every=0)
    assert runner.run(lambda step: StepResult({"loss": 1.0}, lr=0.1), pause_at=3) is False
    assert runner.step == 3 and saved[-1][0] == 3
    again, _ = _runner(tmp_path / "b", ckpt_every=0)
    again.restore(3, saved[-1][1])
    steps = []
    assert again.run(lambda step: steps.append(step) or StepResult({"loss": 1.0}, 0.1))
    assert steps == list(range(3, 10)) and again.tokens == 80


def test_runner_stops_on_any_non_finite_value(tmp_path):
    runner, saved = _runner(tmp_path)
    with pytest.raises(TrainingDiverged, match=r"training aux became inf at step 6; .*none "
                                               r"\(no checkpoint written yet\).*Lower the rate"):
        runner.run(lambda step: StepResult({"loss": 1.0, "aux": float("inf") if step == 6
                                            else 0.0}, lr=0.1))
    assert [step for step, _ in saved] == [5]


def test_schedules_warm_up_then_decay_or_hold():
    assert warmup_cosine(0, 1.0, 10, 110, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(9, 1.0, 10, 110, 0.1) == pytest.approx(1.0)
    assert warmup_cosine(60, 1.0, 10, 110, 0.1) == pytest.approx(0.55)
    assert warmup_cosine(500, 1.0, 10, 110, 0.1) == pytest.approx(0.1)
    assert [warmup_constant(s, 2.0, 4) for s in (0, 3, 100)] == [0.5, 2.0, 2.0]


def test_a_config_that_fails_building_the_model_writes_nothing(tiny_run_config, tmp_path):
    out = tmp_path / "run"
    bad = tiny_run_config(steps=2)
    bad["model"]["attention"]["projections"] = {"name": "dense", "n_kv_heads": 3}
    with pytest.raises(ValueError, match="multiple of n_kv_heads=3"):
        train(load_run_config(base=bad), out, progress=False)
    assert not out.exists()
    assert train(load_run_config(base=tiny_run_config(steps=2)), out, progress=False)["steps"] == 2


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_folder(
    tiny_run_config, tmp_path, monkeypatch
):
    original = DecoderLM.forward

    def poisoned(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(DecoderLM, "forward", poisoned)
    kept = tmp_path / "existing"
    kept.mkdir()
    for out in (tmp_path / "new", kept):
        with pytest.raises(TrainingDiverged, match="loss became nan at step 0"):
            train(load_run_config(base=tiny_run_config(steps=5)), out, progress=False)
    assert not (tmp_path / "new").exists()
    assert kept.is_dir()  # a folder the user made is never removed


def test_resume_with_changes_rewrites_the_config_and_records_them(tiny_run_config, tmp_path):
    out = tmp_path / "run"
    train(load_run_config(base=tiny_run_config(steps=10)), out, progress=False)
    changed = load_run_config(out / "config.yaml", ["train.steps=14", "train.lr=1e-3",
                                                    "model.dropout=0.1"])
    summary = train(changed, out, resume=True, progress=False)
    rewritten = load_run_config(out / "config.yaml")
    assert (rewritten.train.steps, rewritten.train.lr, rewritten.model.dropout) == (14, 1e-3, 0.1)
    assert load_run(out).cfg.model.dropout == 0.1  # what eval rebuilds is what ran
    change = {"step": 10, "changes": {"model.dropout": {"from": 0.0, "to": 0.1},
                                      "train.lr": {"from": 3e-3, "to": 1e-3},
                                      "train.steps": {"from": 10, "to": 14}}}
    assert summary["config_changes"] == [change]
    assert json.loads((out / "config_changes.jsonl").read_text()) == change


def test_resuming_a_finished_run_changes_nothing(tiny_run_config, tmp_path):
    out = tmp_path / "run"
    cfg = tiny_run_config(steps=10)
    first = train(load_run_config(base=cfg), out, progress=False)
    metrics = (out / "metrics.jsonl").read_bytes()
    assert train(load_run_config(base=cfg), out, resume=True, progress=False) == first
    assert (out / "metrics.jsonl").read_bytes() == metrics
    assert not (out / "config_changes.jsonl").exists()


def test_metrics_log_never_repeats_a_record_after_resume(tmp_path):
    log = MetricsLog(tmp_path, None)
    for record in ({"step": 5, "loss": 1.0}, {"step": 10, "loss": 0.5},
                   {"step": 10, "eval_loss": 0.7}, {"step": 12, "loss": 0.4}):
        log.write(record)
    resumed = MetricsLog(tmp_path, 10)  # the final evaluation at step 10 redone
    resumed.write({"step": 10, "eval_loss": 0.7})
    assert [(r["step"], sorted(r)) for r in _records(tmp_path)] == [
        (5, ["loss", "step"]), (10, ["loss", "step"]), (10, ["eval_loss", "step"])]


def test_run_folder_refusals(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file, not a folder"):
        RunFolder(tmp_path / "file", "config.yaml", "run", resume=False).check()
    with pytest.raises(RunDirError, match="there is no distillation in .* to resume \\(no "
                                          "distill.yaml\\)"):
        RunFolder(tmp_path / "empty", "distill.yaml", "distillation", resume=True).check()
    with pytest.raises(RunDirError, match="cannot write .*: .*file.* is a file"):
        RunFolder(tmp_path / "file" / "run", "config.yaml", "run", resume=False).check()


def test_sigterm_saves_the_step_and_raises(tiny_run_config, tmp_path, monkeypatch):
    original = DecoderLM.forward
    calls = {"n": 0}

    def signalled(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4 and self.training:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DecoderLM, "forward", signalled)
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted, match="stopped by SIGTERM after step 4") as info:
        train(load_run_config(base=tiny_run_config(steps=20, eval_every=0)), out,
              progress=False)
    assert info.value.exit_code == 143
    assert latest_checkpoint(out).name == "step-00000004"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is gone


def _cli_train(config, out, *extra):
    return [sys.executable, "-m", "attnlab", "train", "--config", config, "--out", str(out),
            "--quiet", *extra]


def test_ctrl_c_saves_a_checkpoint_and_resume_ends_like_an_uninterrupted_run(
    tiny_run_config, tmp_path
):
    config = dump_config(tiny_run_config(steps=120, ckpt_every=0, eval_every=40),
                         tmp_path / "cfg.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    reference = tmp_path / "reference"
    subprocess.run(_cli_train(config, reference), check=True, env=env, capture_output=True)

    out = tmp_path / "interrupted"
    proc = subprocess.Popen(_cli_train(config, out), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.01)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert f"continue with: attnlab train --out {out} --resume" in err
    assert not (out / "summary.json").exists() and latest_checkpoint(out) is not None

    subprocess.run(_cli_train(config, out, "--resume"), check=True, env=env,
                   capture_output=True)
    a = json.loads((reference / "summary.json").read_text())
    b = json.loads((out / "summary.json").read_text())
    assert b["steps"] == a["steps"] == 120
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-6)
    assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-6)


def test_distillation_shares_the_lifecycle(tiny_run_config, tmp_path):
    teacher = tmp_path / "teacher"
    train(load_run_config(base=tiny_run_config(steps=4, eval_every=0,
                                               final_eval_tokens=1024)), teacher, progress=False)

    def cfg(**distill_cfg):
        return load_distill_config(base={"distill": {
            "steps": 4, "batch_size": 2, "eval_every": 0, "final_eval_tokens": 512,
            "ckpt_every": 2, "log_every": 2, "query_skip": [1], "long_context": 1,
            "dynamic_k": [4], "teacher": str(teacher),
            "student_attention": {"name": "sea", "k": 4, "predictor_length": 8},
            **distill_cfg}})

    out = tmp_path / "student"
    with pytest.raises(ConfigError):
        distill(cfg(student_attention={"name": "sea", "k": 0}), out, progress=False)
    assert not out.exists()
    first = distill(cfg(steps=2), out, progress=False)
    assert first["steps"] == 2
    resumed = distill(cfg(steps=4), out, resume=True, progress=False)
    assert resumed["config_changes"] == [
        {"step": 2, "changes": {"distill.steps": {"from": 2, "to": 4}}}]
    metrics = (out / "metrics.jsonl").read_bytes()
    assert distill(cfg(steps=4), out, resume=True, progress=False) == resumed
    assert (out / "metrics.jsonl").read_bytes() == metrics
