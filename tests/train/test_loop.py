import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from attnlab.models import DecoderLM
from attnlab.train import (
    CheckpointError,
    RunDirError,
    TrainingDiverged,
    load_checkpoint,
    load_run_config,
    train,
)
from attnlab.train.checkpoint import latest_checkpoint
from attnlab.train.loop import lr_at
from tests.helpers import dump_config


def test_run_writes_its_files_and_learns(tiny_run_config, tmp_path):
    out = tmp_path / "run"
    summary = train(load_run_config(base=tiny_run_config(steps=60)), out, progress=False)
    for name in ("config.yaml", "tokenizer.json", "metrics.jsonl", "summary.json"):
        assert (out / name).is_file(), name
    for key in ("params", "steps", "tokens", "eval_loss", "eval_bpc", "tokens_per_s",
                "peak_rss_mb", "wall_s"):
        assert key in summary, key
    assert summary["steps"] == 60 and summary["tokens"] == 60 * 4 * 32
    assert summary["eval_bpc"] < 5.5  # uniform over bytes is 8 bits
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 1.0
    assert json.loads((out / "summary.json").read_text()) == summary
    assert latest_checkpoint(out).name == "step-00000060"


def test_existing_run_is_never_overwritten(tiny_run_config, tmp_path):
    out = tmp_path / "run"
    train(load_run_config(base=tiny_run_config(steps=5)), out, progress=False)
    before = (out / "summary.json").read_bytes()
    with pytest.raises(RunDirError, match="already holds a run; pass --resume"):
        train(load_run_config(base=tiny_run_config(steps=5)), out, progress=False)
    assert (out / "summary.json").read_bytes() == before
    with pytest.raises(RunDirError, match="there is no run in .*empty to resume"):
        train(load_run_config(base=tiny_run_config()), tmp_path / "empty", resume=True)


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    tiny_run_config, tmp_path, monkeypatch
):
    original = DecoderLM.forward
    calls = {"n": 0}

    def poisoned(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] > 13 and self.training:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(DecoderLM, "forward", poisoned)
    out = tmp_path / "run"
    cfg = load_run_config(base=tiny_run_config(steps=30, ckpt_every=5, eval_every=0))
    with pytest.raises(TrainingDiverged, match=r"loss became nan at step 13.*step-00000010"):
        train(cfg, out, progress=False)
    assert not (out / "summary.json").exists()
    model = DecoderLM(load_run_config(out / "config.yaml").model)
    ckpt = load_checkpoint(out, model)
    assert ckpt.step == 10
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_lr_schedule_warms_up_then_decays_by_cosine(tiny_run_config):
    cfg = load_run_config(base=tiny_run_config(steps=110, warmup_steps=10, lr=1.0,
                                               min_lr_ratio=0.1))
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_corrupt_and_mismatched_checkpoints_give_clear_errors(tiny_run_config, tmp_path):
    out = tmp_path / "run"
    train(load_run_config(base=tiny_run_config(steps=5)), out, progress=False)
    wider = load_run_config(out / "config.yaml", ["model.d_model=64"])
    with pytest.raises(CheckpointError, match="does not fit the model this config builds"):
        load_checkpoint(out, DecoderLM(wider.model))
    (latest_checkpoint(out) / "model.safetensors").write_bytes(b"garbage")
    model = DecoderLM(load_run_config(out / "config.yaml").model)
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        load_checkpoint(out, model)


def test_grad_accumulation_and_xl_memory_run(tiny_run_config, tmp_path):
    cfg = tiny_run_config(steps=6, grad_accum=2)
    cfg["model"]["memory_len"] = 32
    cfg["model"]["attention"]["positions"] = "xl"
    summary = train(load_run_config(base=cfg), tmp_path / "run", progress=False)
    assert summary["tokens"] == 6 * 2 * 4 * 32
    assert math.isfinite(summary["eval_loss"])


def _train_cmd(config_path, out, *extra):
    return [sys.executable, "-m", "attnlab", "train", "--config", config_path, "--out", str(out),
            "--quiet", *extra]


def test_sigkill_then_resume_reaches_the_uninterrupted_result(tiny_run_config, tmp_path):
    """Kill -9 a run mid-way; ``--resume`` must end exactly where an uninterrupted run ends.

    Uses XL memory and dropout so memory and RNG state must both survive the checkpoint.
    """
    cfg = tiny_run_config(steps=150, ckpt_every=20, eval_every=50)
    cfg["model"].update(memory_len=32, dropout=0.1, d_model=64)
    cfg["model"]["attention"]["positions"] = "xl"
    config_path = dump_config(cfg, tmp_path / "cfg.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    reference = tmp_path / "reference"
    subprocess.run(_train_cmd(config_path, reference), check=True, env=env,
                   capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd(config_path, killed), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        ckpt = latest_checkpoint(killed) if (killed / "checkpoints" / "latest").exists() else None
        if ckpt is not None and ckpt.name >= "step-00000040":
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "summary.json").exists()

    subprocess.run(_train_cmd(config_path, killed, "--resume"), check=True, env=env,
                   capture_output=True)
    a = json.loads((reference / "summary.json").read_text())
    b = json.loads((killed / "summary.json").read_text())
    assert b["steps"] == a["steps"] == 150 and b["tokens"] == a["tokens"]
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-6)
    assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-6)


@pytest.mark.parametrize("core", ["eager", "performer", "reformer", "sea"])
def test_every_core_trains_by_changing_one_config_line(core, tiny_run_config, tmp_path):
    cfg = tiny_run_config(steps=4, eval_every=0, ckpt_every=0)
    cfg["model"]["attention"]["core"] = core
    summary = train(load_run_config(base=cfg), tmp_path / "run", progress=False)
    assert math.isfinite(summary["eval_loss"]) and summary["steps"] == 4


def test_switchhead_projections_with_a_sea_core_train(tiny_run_config, tmp_path):
    cfg = tiny_run_config(steps=4, eval_every=0, ckpt_every=0)
    cfg["model"]["attention"].update(
        projections={"name": "switchhead", "n_experts": 4, "k": 2},
        core={"name": "sea", "k": 4, "predictor_length": 8},
    )
    summary = train(load_run_config(base=cfg), tmp_path / "run", progress=False)
    assert math.isfinite(summary["eval_loss"]) and summary["steps"] == 4


def test_a_run_paused_in_its_warm_up_resumes_to_a_new_length_exactly(tiny_run_config, tmp_path):
    """``pause_at`` inside the warm-up, then ``resume`` with more steps: the same run as one
    planned at that length from the start (the demo re-plans its steps this way)."""
    def cfg(steps):
        c = tiny_run_config(steps=steps, warmup_steps=10, eval_every=0, ckpt_every=0)
        c["model"].update(memory_len=32)
        c["model"]["attention"]["positions"] = "xl"
        return load_run_config(base=c)

    reference = train(cfg(30), tmp_path / "reference", progress=False)
    paused = tmp_path / "paused"
    assert train(cfg(20), paused, progress=False, pause_at=8) == {"paused_at": 8}
    assert latest_checkpoint(paused).name == "step-00000008"
    assert not (paused / "summary.json").exists()
    resumed = train(cfg(30), paused, resume=True, progress=False)
    assert resumed["steps"] == reference["steps"] == 30
    assert resumed["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-6)
    assert resumed["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-6)
