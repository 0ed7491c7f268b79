"""Issue #32: a resumed run runs what its folder records (or refuses the change), and options
that would run something other than what they say are refused: one ``error:`` line, exit
status 2, no traceback, nothing written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml

from attnlab.demo.budget import Budget
from attnlab.train.checkpoint import latest_checkpoint
from tests.cli.test_errors import assert_user_error, cli
from tests.helpers import dump_config

SEA = "{name: sea, k: 4, predictor_length: 8}"
FAST = ["batch_size=2", "eval_every=0", "eval_tokens=256", "final_eval_tokens=256",
        "grid_reps=0", "long_context=1", "warmup_steps=0", "log_every=1", "dynamic_k=[4]",
        "query_skip=[1]"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder``: its path -> the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def optimizer_settings(run: Path) -> list[dict]:
    """Each optimizer group's settings (all but its parameters) in the run's newest
    checkpoint: what the optimizer ran with at its last step."""
    state = torch.load(latest_checkpoint(run) / "state.pt", weights_only=True)
    return [{k: v for k, v in g.items() if k != "params"}
            for g in state["optimizer"]["param_groups"]]


def recorded(run: Path, name: str) -> dict:
    return yaml.safe_load((run / name).read_text())


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, text_corpus) -> Path:
    from attnlab.train import load_run_config, train

    tmp = tmp_path_factory.mktemp("teacher")
    cfg = {"model": {"d_model": 32, "n_layers": 1, "d_ff": 64, "max_seq_len": 64,
                     "attention": {"n_heads": 2}},
           "data": {"corpus": "text", "path": str(text_corpus), "cache_dir": str(tmp / "cache")},
           "train": {"steps": 2, "batch_size": 2, "seq_len": 32, "eval_every": 0,
                     "final_eval_tokens": 256, "log_every": 1}}
    train(load_run_config(base=cfg), tmp / "run", progress=False)
    return tmp / "run"


def distill(capsys, teacher: Path, out: Path, *args: str, resume: bool = False) -> None:
    argv = ["distill", "--out", out, "--quiet", *(["--resume"] if resume else
                                                   ["--teacher", teacher, "--student-attention",
                                                    SEA]),
            *[a for s in FAST for a in ("--set", s)], *args]
    code, err = cli(argv, capsys)
    assert code == 0, err


def test_a_resumed_distillation_runs_what_a_fresh_one_with_its_settings_runs(
        teacher, tmp_path, capsys):
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    distill(capsys, teacher, fresh, "--recipe", "sea-paper", "--set", "new_lr_mult=5",
            "--set", "steps=2")
    distill(capsys, teacher, resumed, "--recipe", "sea-paper", "--set", "steps=1")
    distill(capsys, teacher, resumed, "--set", "new_lr_mult=5", "--set", "steps=2",
            resume=True)
    settings = optimizer_settings(fresh)
    assert {(g["lr"], g["lr_mult"]) for g in settings} == {(1e-5, 1.0), (5e-5, 5.0)}
    assert optimizer_settings(resumed) == settings  # the checkpoint's 10x was not restored
    assert recorded(resumed, "distill.yaml") == recorded(fresh, "distill.yaml")
    assert recorded(resumed, "config.yaml") == recorded(fresh, "config.yaml")
    # a kept recipe, named again, applies as recorded
    distill(capsys, teacher, resumed, "--recipe", "sea-paper", "--set", "new_lr_mult=5",
            "--set", "steps=3", resume=True)
    assert optimizer_settings(resumed) == settings


@pytest.mark.parametrize("first, then", [("attnlab", "sea-paper"), ("sea-paper", "attnlab")])
def test_a_resumed_distillation_refuses_another_recipe(first, then, teacher, tmp_path, capsys):
    out = tmp_path / "student"
    distill(capsys, teacher, out, "--recipe", first, "--set", "steps=1")
    before = snapshot(out)
    assert_user_error(["distill", "--out", out, "--resume", "--recipe", then, "--set",
                       "steps=2", "--quiet"], capsys, "distill.recipe", f"runs with {first!r}",
                      f"not {then!r}", "keeps its recipe", "--set")
    assert snapshot(out) == before


def test_a_resumed_training_runs_its_changed_optimizer_settings(tiny_run_config, tmp_path,
                                                                 capsys):
    changed = {"weight_decay": 0.05, "beta2": 0.9}
    fresh_cfg = dump_config(tiny_run_config(steps=2, ckpt_every=1, **changed),
                            tmp_path / "fresh.yaml")
    first_cfg = dump_config(tiny_run_config(steps=1, ckpt_every=1), tmp_path / "first.yaml")
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    for argv in (["--config", fresh_cfg, "--out", fresh],
                 ["--config", first_cfg, "--out", resumed],
                 ["--out", resumed, "--resume", "--set", "train.steps=2",
                  *[a for k, v in changed.items() for a in ("--set", f"train.{k}={v}")]]):
        code, err = cli(["train", "--quiet", *argv], capsys)
        assert code == 0, err
    settings = optimizer_settings(fresh)
    assert settings[0]["weight_decay"] == 0.05 and settings[0]["betas"] == (0.9, 0.9)
    assert optimizer_settings(resumed) == settings
    assert recorded(resumed, "config.yaml") == recorded(fresh, "config.yaml")


@pytest.mark.parametrize("override, key", [("data.tokenizer=bpe", "data.tokenizer"),
                                           ("data.vocab_size=512", "data.vocab_size")])
def test_a_resumed_training_keeps_its_tokenizer(override, key, tiny_run_config, tmp_path,
                                                capsys):
    run = tmp_path / "run"
    code, err = cli(["train", "--quiet", "--config", dump_config(
        tiny_run_config(steps=1), tmp_path / "cfg.yaml"), "--out", run], capsys)
    assert code == 0, err
    before = snapshot(run)
    assert_user_error(["train", "--quiet", "--out", run, "--resume", "--set", override,
                       "--set", "train.steps=2"], capsys, key, "tokenizer it started with")
    assert snapshot(run) == before


@pytest.mark.parametrize("text, words", [
    ("", ["holds no settings"]),
    ("# a comment\n", ["holds no settings"]),
    ("- model\n", ["top level must be a mapping", "list"]),
    ("0\n", ["top level must be a mapping", "int"]),
])
def test_match_refuses_a_config_file_without_settings(text, words, tmp_path, capsys):
    config = tmp_path / "dense.yaml"
    config.write_text(text)
    out = tmp_path / "matched.yaml"
    assert_user_error(["match", "--config", config, "--heads", 2, "--experts", 4, "--out", out,
                       "--json", tmp_path / "m.json"], capsys, str(config), *words)
    assert not out.exists() and not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("config, extra, got", [
    ("tiny/switchhead", [], "projections 'switchhead'"),
    ("tiny/moa", [], "projections 'moa'"),
    ("tiny/switchall", [], "mlp 'sigma_moe'"),
    ("tiny/dense-h8", ["--set", "model.attention.projections={name: moa, n_experts: 8}"],
     "projections 'moa'"),
])
def test_match_refuses_a_baseline_that_is_not_dense(config, extra, got, tmp_path, capsys):
    out = tmp_path / "matched.yaml"
    assert_user_error(["match", "--config", config, *extra, "--heads", 2, "--experts", 4,
                       "--out", out], capsys, "needs a dense baseline", got, "'dense'")
    assert not out.exists()


@pytest.mark.parametrize("args, words", [
    (["--recipe", ""], ["unknown recipe ''", "'sea-paper'"]),
    (["--recipe", "SEA-paper"], ["unknown recipe 'SEA-paper'", "'attnlab'"]),
    (["--set", "recipe=null"], ["unknown recipe None", "'sea-paper'"]),
    (["--student-attention", ""], ["distill.student_attention"]),
    (["--gguf-file", ""], ["gguf_file is empty"]),
    (["--teacher", ""], ["distill.teacher is empty"]),
    (["--set", "query_skip=[]"], ["query_skip", "empty"]),
    (["--set", "dynamic_k=[]"], ["dynamic_k", "empty"]),
    (["--set", "eval_tokens=0"], ["eval_tokens must be >= 1"]),
    (["--set", "final_eval_tokens=0"], ["final_eval_tokens must be >= 1"]),
    (["--set", "keep_checkpoints=-1"], ["keep_checkpoints must be >= 0"]),
    (["--set", "lr=.inf"], ["distill.lr", "finite"]),
])
def test_distill_options_that_would_run_something_else(args, words, teacher, tmp_path, capsys):
    out = tmp_path / "student"
    assert_user_error(["distill", "--teacher", teacher, "--out", out, "--quiet", *args],
                      capsys, *words)
    assert not out.exists()


@pytest.mark.parametrize("trained_len", ["-5", "0", "2.5", "true", "'512'"])
def test_a_students_trained_len_must_be_a_positive_integer(trained_len, tmp_path, capsys):
    variant = f"{{name: sea, student: {tmp_path}, trained_len: {trained_len}}}"
    assert_user_error(["long-context", "--model", tmp_path / "model", "--variant", variant,
                       "--json", tmp_path / "out.json"], capsys, "trained_len",
                      "positive integer")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("argv, words", [
    (["demo", "--budget-minutes", "inf"], ["--budget-minutes", "finite"]),
    (["demo", "--budget-minutes", "nan"], ["--budget-minutes", "finite"]),
    (["demo", "--budget-minutes", "-3"], ["--budget-minutes", "greater than 0"]),
    (["demo", "--budget-minutes", ""], ["--budget-minutes", "expected a number"]),
    (["demo", "--strict-budget", "--real-model", "on", "--budget-minutes", "1"],
     ["--strict-budget --budget-minutes 1", "--real-model on", "20.3 minutes"]),
    (["demo", "--smoke", "--strict-budget", "--real-model", "on", "--budget-minutes", "0.1"],
     ["cannot fit the real-model stage", "0.167 minutes"]),
    (["generate", "--run", "r", "--prompt", "a", "--temperature", "inf"],
     ["--temperature", "finite"]),
    (["bench", "attention", "--max-mem-gb", "inf"], ["--max-mem-gb", "finite"]),
    (["long-context", "--model", "m", "--depths", "0.5,nan"], ["--depths", "finite"]),
])
def test_numbers_that_mean_nothing_are_refused_before_work(argv, words, tmp_path, capsys):
    out = tmp_path / "out"
    if argv[0] == "demo":
        argv = [*argv, "--out", out]
    assert_user_error(argv, capsys, *words)
    assert not out.exists()


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 0.0, -60.0])
def test_a_budget_is_a_finite_positive_time(seconds):
    with pytest.raises(ValueError, match="finite number of seconds > 0"):
        Budget(seconds)


@pytest.mark.parametrize("setting", ["data.tokenizer=bpe", "data.vocab_size=512"])
def test_distill_refuses_a_tokenizer_it_would_not_use(setting, tmp_path, capsys):
    out = tmp_path / "s"
    assert_user_error(["distill", "--teacher", tmp_path, "--out", out, "--set", setting],
                      capsys, setting.split("=")[0], "teacher's own tokenizer")
    assert not out.exists()
