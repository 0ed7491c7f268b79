"""Every kind of user mistake at the command line: one ``error:`` line (or argparse's usage
and error), exit status 2, no traceback, and words that name the problem and the fix."""

from __future__ import annotations

import os
import shutil
from importlib.resources import files
from pathlib import Path

import pytest
import torch

from attnlab.cli import MIN_REPS, main
from tests.helpers import dump_config

CONFIGS = Path(str(files("attnlab") / "configs"))


def cli(argv, capsys) -> tuple[int, str]:
    """``attnlab ARGV`` in this process: (exit status, stderr)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    return code, capsys.readouterr().err


def assert_user_error(argv, capsys, *words, code=2):
    status, err = cli(argv, capsys)
    assert status == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error" in line]
    assert lines, err
    for word in words:
        assert word in err, f"{word!r} not in {err!r}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, text_corpus):
    from attnlab.train import load_run_config, train

    tmp = tmp_path_factory.mktemp("cli-errors")
    cfg = {"model": {"d_model": 32, "n_layers": 1, "d_ff": 64, "max_seq_len": 64,
                     "attention": {"n_heads": 2}},
           "data": {"corpus": "text", "path": str(text_corpus),
                    "cache_dir": str(tmp / "cache")},
           "train": {"steps": 3, "batch_size": 2, "seq_len": 32, "eval_every": 0,
                     "final_eval_tokens": 256, "log_every": 1}}
    train(load_run_config(base=cfg), tmp / "run", progress=False)
    return tmp / "run"


@pytest.fixture
def config(tiny_run_config, tmp_path):
    return dump_config(tiny_run_config(steps=2), tmp_path / "cfg.yaml")


@pytest.mark.parametrize("override, words", [
    ("train.lr", ["train.lr", "key.path=value"]),
    ("=3", ["not a key path"]),
    ("train.lr=abc", ["train.lr", "expected a number"]),
    ("model.attention.core={name: sea, k:", ["not valid YAML", "quote a mapping"]),
    ("train.stesp=3", ["unknown config key", "did you mean 'steps'"]),
    ("model.attention.projections={name: dense, n_kv_heads: 3}", ["n_kv_heads=3"]),
    ("train.lr=nan", ["train.lr", "finite number"]),
    ("model.attention.core={name: sdpa, k: 3}", ["core:sdpa.k", "valid keys here"]),
    ("model.attention.positions={name: none, k: 3}", ["positions:none.k", "takes no options"]),
])
def test_malformed_overrides(override, words, config, tmp_path, capsys):
    out = tmp_path / "run"
    assert_user_error(["train", "--config", config, "--out", out, "--set", override, "--quiet"],
                      capsys, *words)
    assert not out.exists()  # nothing written for a config that fails


def test_malformed_student_yaml(tmp_path, capsys):
    assert_user_error(["distill", "--teacher", tmp_path, "--out", tmp_path / "s",
                       "--student-attention", "{name: sea, k:"], capsys, "not valid YAML")


def test_an_unknown_distillation_recipe(tmp_path, capsys):
    out = tmp_path / "s"
    assert_user_error(["distill", "--teacher", tmp_path, "--out", out, "--recipe", "paper"],
                      capsys, "unknown recipe 'paper'", "'sea-paper'")
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_a_device_the_machine_lacks(config, run_dir, tmp_path, capsys):
    assert_user_error(["train", "--config", config, "--out", tmp_path / "r", "--set",
                       "train.device=cuda"], capsys, "train.device", "not available", "cpu")
    assert_user_error(["eval", "--run", run_dir, "--device", "cuda"], capsys, "not available")
    assert_user_error(["generate", "--run", run_dir, "--prompt", "a", "--device", "tpu"],
                      capsys, "valid: cpu, cuda")


def test_corrupt_files_say_why(run_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    assert_user_error(["eval", "--run", broken], capsys, "tokenizer.json", "not JSON")
    shutil.copy(run_dir / "tokenizer.json", broken / "tokenizer.json")
    state = next((broken / "checkpoints").glob("step-*")) / "state.pt"
    state.write_bytes(b"garbage")
    assert_user_error(["eval", "--run", broken], capsys, "state.pt is corrupt",
                      "older checkpoint")
    assert_user_error(["train", "--resume", "--out", broken, "--quiet"], capsys,
                      "state.pt is corrupt")


def test_outputs_that_cannot_be_written(run_dir, config, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_user_error(["train", "--config", config, "--out", blocker / "run"], capsys,
                      "cannot write", "is a file")
    assert_user_error(["bench", "attention", "--json", tmp_path], capsys, "--json",
                      "not a file path")
    assert_user_error(["report", run_dir, "--out", blocker], capsys, "--out",
                      "a file, not a folder")
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert_user_error(["train", "--config", config, "--out", locked / "run"], capsys,
                          "not writable")
    if os.path.isdir("/proc"):  # refuses new files for root as well
        assert_user_error(["train", "--config", config, "--out", "/proc/attnlab-run"], capsys,
                          "cannot write the run to /proc/attnlab-run")


@pytest.mark.parametrize("argv, words", [
    (["generate", "--prompt", "a", "--max-new-tokens", "0"], ["--max-new-tokens", "at least 1"]),
    (["generate", "--prompt", "a", "--top-k", "0"], ["--top-k", "at least 1"]),
    (["generate", "--prompt", "a", "--temperature", "-1"], ["--temperature", "at least 0"]),
    (["eval", "--batch-size", "0"], ["--batch-size", "at least 1"]),
    (["eval", "--seq-len", "-4"], ["--seq-len", "at least 1"]),
    (["eval", "--max-tokens", "x"], ["--max-tokens", "expected an integer"]),
    (["eval", "--seq-len", "65"], ["--seq-len 65", "max_seq_len 64"]),
    (["eval", "--set", "data.tokenizer=bpe"], ["run's own tokenizer"]),
    (["bench", "attention", "--reps", "2"], ["--reps", f"at least {MIN_REPS}"]),
    (["bench", "attention", "--heads", "0"], ["--heads", "at least 1"]),
    (["bench", "attention", "--seq-lens", "1024,0"], ["--seq-lens", "at least 1"]),
    (["bench", "expert-matmul", "--tokens", "0"], ["--tokens", "at least 1"]),
    (["bench", "train", "--configs", "tiny", "--steps", "1"], ["--steps", "at least"]),
    (["bench", "serve", "--batches", "0"], ["--batches", "at least 1"]),
    (["long-context", "--model", "m", "--depths", "1.5"], ["depth must be between 0 and 1"]),
    (["demo", "--budget-minutes", "0"], ["--budget-minutes", "greater than 0"]),
])
def test_numeric_arguments_are_checked_before_work(argv, words, run_dir, capsys):
    if argv[0] in ("generate", "eval"):
        argv = [argv[0], "--run", run_dir, *argv[1:]]
    assert_user_error(argv, capsys, *words)


def test_min_reps_matches_the_benchmarks():
    from attnlab.results import MIN_REPS as BENCH_MIN_REPS

    assert MIN_REPS == BENCH_MIN_REPS


def test_resume_cannot_change_the_models_shape(run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    assert_user_error(["train", "--resume", "--out", run, "--set", "model.d_model=48",
                       "--set", "train.steps=5", "--quiet"], capsys,
                      "does not fit the model", "more", "keeps its model's shape")
    assert (run / "config.yaml").read_text() == (run_dir / "config.yaml").read_text()
    assert not (run / "config_changes.jsonl").exists()


def test_resume_where_there_is_no_run(tmp_path, capsys):
    for command, kind in (("train", "run"), ("distill", "distillation")):
        assert_user_error([command, "--resume", "--out", tmp_path / "none"], capsys,
                          f"there is no {kind} in", "start one without --resume")
    assert not (tmp_path / "none").exists()


def test_data_in_the_wrong_format(config, tmp_path, capsys):
    fake = tmp_path / "enwik8"
    fake.write_bytes(b"<mediawiki>" * 10)
    assert_user_error(["train", "--config", config, "--out", tmp_path / "r", "--set",
                       "data.corpus=enwik8", "--set", f"data.path={fake}"], capsys,
                      "enwik8", "100,000,000")
    assert not (tmp_path / "r").exists()


def test_verbose_shows_the_traceback(tmp_path, capsys):
    status, err = cli(["-v", "eval", "--run", tmp_path / "missing"], capsys)
    assert status == 2 and "Traceback" in err and "not an attnlab run folder" in err


SHIPPED_CONFIGS = sorted(
    str(path.relative_to(CONFIGS)) for path in CONFIGS.rglob("*.yaml")
)


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_macs_on_every_shipped_config(name, capsys):
    """Figures, or one line saying what the accounting does not cover."""
    status = main(["macs", "--config", str(CONFIGS / name)])
    out, err = capsys.readouterr()
    if status == 0:
        assert "model_macs_per_token" in out
    else:
        assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert ("no MAC accounting for" in err or "distillation config" in err
                or "estimator recipe" in err), err
