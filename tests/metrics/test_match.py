"""``attnlab match``: SwitchHead / MoA configs with the parameter count of a dense baseline.

The documented bound: the matched count is within half of ``MatchReport.step_params`` (one
unit of the last-solved size) of the dense count, which for these configs is under 1%
(tiny, d_head alone: 0.64%; with d_ff solved: under 0.06%)."""

from __future__ import annotations

import dataclasses
import json
from importlib.resources import files
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.metrics import match_params
from attnlab.models import DecoderLM, ModelConfig
from attnlab.train import load_run_config

CONFIGS = Path(str(files("attnlab") / "configs"))
TINY_DENSE = CONFIGS / "tiny" / "dense-h8.yaml"


def meta_params(model: ModelConfig) -> int:
    """``DecoderLM(model).num_params()`` built on the meta device (vocabulary 256 if unset)."""
    with torch.device("meta"):
        return DecoderLM(dataclasses.replace(model, vocab_size=model.vocab_size or 256)
                         ).num_params()


def assert_matched(report, rel: float = 0.01) -> None:
    """Within half a step of the solved size, and within ``rel``."""
    assert abs(report.params - report.dense_params) <= report.step_params // 2
    assert abs(report.rel_diff) < rel


def test_tiny_switchhead_reproduces_the_shipped_config():
    dense = load_run_config(TINY_DENSE)
    matched, report = match_params(dense, "switchhead", n_heads=2, n_experts=4, k=2)
    shipped = load_run_config(CONFIGS / "tiny" / "switchhead.yaml")
    assert matched.model == shipped.model  # d_head 28, d_ff 517, no XL content biases
    assert (report.d_head, report.d_ff, report.params) == (28, 517, 888_064)
    assert report.params == report.dense_params == DecoderLM(
        dataclasses.replace(matched.model, vocab_size=256)).num_params()  # a real build
    assert report.content_bias_dropped
    assert report.attention_macs < report.dense_attention_macs


@pytest.mark.parametrize("solve", ["both", "d_head", "d_ff"])
@pytest.mark.parametrize(("projections", "heads", "experts", "k"),
                         [("switchhead", 2, 4, 2), ("moa", 2, 8, None)])
def test_tiny_every_solve_is_within_the_bound(solve, projections, heads, experts, k):
    dense = load_run_config(TINY_DENSE)
    matched, report = match_params(dense, projections, n_heads=heads, n_experts=experts, k=k,
                                   solve=solve)
    assert_matched(report)
    assert meta_params(matched.model) == report.params
    assert report.dense_params == meta_params(dense.model)
    if solve == "d_head":
        assert report.d_ff == dense.model.d_ff
    if solve == "d_ff":
        assert report.d_head == dense.model.d_head
    assert matched.model.attention.projections.name == projections
    assert report.attention_macs is not None


@pytest.mark.parametrize(("dense", "heads", "experts", "k", "shipped"), [
    ("wt103-47m-dense-h10", 2, 5, 2, "wt103-47m-switchhead"),
    ("wt103-262m-dense-h16", 2, 8, 4, "wt103-262m-switchhead"),
])
def test_paper_configs(dense, heads, experts, k, shipped):
    """The paper's recipe gives the shipped d_head. The shipped 47M d_ff is 2080 where
    attnlab's exact count puts 2081 nearest (+4 parameters per layer against 2080's -820):
    the paper's own analytic count (2,540,385 vs 2,540,412 per layer, spec section 1) differs
    slightly from attnlab's modules. The 262M d_ff (4147) is reproduced exactly."""
    dense_cfg = load_run_config(CONFIGS / "paper" / f"{dense}.yaml")
    matched, report = match_params(dense_cfg, "switchhead", n_heads=heads, n_experts=experts,
                                   k=k)
    ship = load_run_config(CONFIGS / "paper" / f"{shipped}.yaml").model
    assert report.d_head == ship.d_head
    assert abs(report.d_ff - ship.d_ff) <= 1
    assert_matched(report, rel=1e-4)
    assert meta_params(matched.model) == report.params
    assert dataclasses.replace(matched.model, d_ff=ship.d_ff) == ship  # all else as shipped


def test_solving_is_deterministic():
    dense = load_run_config(TINY_DENSE)
    first = match_params(dense, "moa", n_heads=2, n_experts=8, solve="d_head")
    assert match_params(dense, "moa", n_heads=2, n_experts=8, solve="d_head") == first


def test_a_model_config_is_matched_with_a_train_section():
    model = load_run_config(TINY_DENSE).model
    matched, report = match_params(model, "switchhead", n_heads=2, n_experts=4)
    assert matched.train.seq_len == model.max_seq_len - model.memory_len
    assert report.k == 2 and report.d_head == 28


def test_uncovered_cores_have_no_macs():
    dense = load_run_config(CONFIGS / "tiny.yaml", ["model.attention.core=performer"])
    _, report = match_params(dense, "switchhead", n_heads=2, n_experts=2)
    assert report.dense_attention_macs is None and report.attention_macs is None
    assert_matched(report)


@pytest.mark.parametrize(("choice", "words"), [
    ({"projections": "switchead"}, ["did you mean 'switchhead'", "['moa', 'switchhead']"]),
    ({"projections": "dense"}, ["cannot match projections 'dense'"]),
    ({"k": 5}, ["k=5 exceeds n_experts=4", "1..4"]),
    ({"k": 0}, ["k must be >= 1"]),
    ({"projections": "moa", "k": 2}, ["moa takes no k"]),
    ({"projections": "moa", "n_heads": 6}, ["n_experts >= 6"]),
    ({"solve": "d_model"}, ["['both', 'd_head', 'd_ff']"]),
    ({"d_head": 32}, ["only with solve 'd_ff'"]),
    ({"solve": "d_ff", "d_head_multiple": 8}, ["keeps d_head fixed"]),
    ({"n_experts": 64, "n_heads": 8, "solve": "d_head"}, ["no d_head matches", "d_head=1"]),
    ({"solve": "d_ff", "d_head": 4096}, ["no d_ff matches"]),
])
def test_bad_choices_are_config_errors(choice, words):
    dense = load_run_config(TINY_DENSE)
    args = {"projections": "switchhead", "n_heads": 2, "n_experts": 4, **choice}
    with pytest.raises(ConfigError) as err:
        match_params(dense, args.pop("projections"), **args)
    for word in words:
        assert word in str(err.value)


def run_cli(argv: list, capsys) -> tuple[int, str, str]:
    """``attnlab ARGV`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_writes_a_trainable_config(tmp_path, capsys):
    out, report_path = tmp_path / "sh.yaml", tmp_path / "sh.json"
    code, stdout, err = run_cli(
        ["match", "--config", TINY_DENSE, "--projections", "switchhead", "--heads", 2,
         "--experts", 4, "--k", 2, "--set", "train.steps=7", "--out", out,
         "--json", report_path], capsys)
    assert code == 0, err
    assert "attention MACs/token" in stdout and f"saved {out}" in stdout
    report = json.loads(report_path.read_text())
    text = out.read_text()
    assert text.startswith("# Matched by `attnlab match`")
    cfg = load_run_config(out)  # what `attnlab train --config` loads
    assert cfg.train.steps == 7  # --set applies to the dense config, kept in the output
    assert (cfg.model.d_head, cfg.model.d_ff) == (report["d_head"], report["d_ff"])
    assert meta_params(cfg.model) == report["params"] == report["dense_params"]


@pytest.mark.parametrize(("argv", "words"), [
    (["--heads", 0, "--experts", 4], ["argument --heads", "at least 1"]),
    (["--heads", 2, "--experts", "four"], ["argument --experts", "expected an integer"]),
    (["--heads", 2, "--experts", 4, "--projections", "dense"], ["--projections"]),
])
def test_cli_bad_argument(argv, words, tmp_path, capsys):
    out = tmp_path / "m.yaml"
    code, _, err = run_cli(["match", "--config", TINY_DENSE, "--out", out, *argv], capsys)
    assert code == 2 and "Traceback" not in err
    assert all(word in err for word in words), err
    assert not out.exists()


@pytest.mark.parametrize(("argv", "words"), [
    (["--heads", 2, "--experts", 2, "--k", 3], ["k=3 exceeds n_experts=2"]),
    (["--heads", 2, "--experts", 8, "--projections", "moa", "--k", 2], ["moa takes no k"]),
    (["--heads", 2, "--experts", 4, "--set", "model.d_fff=3"], ["did you mean 'd_ff'"]),
])
def test_cli_user_error_is_one_line(argv, words, tmp_path, capsys):
    out = tmp_path / "m.yaml"
    code, stdout, err = run_cli(["match", "--config", TINY_DENSE, "--out", out, *argv], capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert all(word in err for word in words), err
    assert not out.exists() and not stdout


def test_cli_unwritable_out_is_refused_before_work(tmp_path, capsys):
    code, stdout, err = run_cli(["match", "--config", TINY_DENSE, "--heads", 2, "--experts", 4,
                                 "--out", tmp_path], capsys)
    assert code == 2 and "--out" in err and "a folder, not a file path" in err
    assert not stdout
