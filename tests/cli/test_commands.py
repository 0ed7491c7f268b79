import json

import pytest
import torch

from attnlab.cli import main
from attnlab.config import builtin_config
from attnlab.train import load_run_config
from tests.helpers import dump_config


@pytest.fixture
def trained_run(tiny_run_config, tmp_path):
    config = dump_config(tiny_run_config(steps=30), tmp_path / "cfg.yaml")
    out = tmp_path / "run"
    assert main(["train", "--config", config, "--out", str(out), "--quiet"]) == 0
    return out


def test_train_eval_generate(trained_run, capsys):
    capsys.readouterr()
    assert main(["eval", "--run", str(trained_run), "--split", "valid", "--max-tokens",
                 "2048", "--threads", str(torch.get_num_threads())]) == 0
    captured = capsys.readouterr()
    assert "eval: 100%" in captured.err  # the progress bar
    report = json.loads(captured.out)
    assert report["split"] == "valid" and report["step"] == 30 and report["bpc"] < 8
    assert main(["generate", "--run", str(trained_run), "--prompt", "def ", "--max-new-tokens",
                 "20", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def ") and len(text) > 10


def test_user_errors_exit_2_with_a_message(tiny_run_config, tmp_path, capsys):
    cfg = tiny_run_config()
    cfg["train"]["stesp"] = 3
    config = dump_config(cfg, tmp_path / "bad.yaml")
    assert main(["train", "--config", config, "--out", str(tmp_path / "x")]) == 2
    assert "unknown config key 'train.stesp' (did you mean 'steps'?)" in capsys.readouterr().err
    assert main(["eval", "--run", str(tmp_path / "missing")]) == 2
    assert "not an attnlab run folder" in capsys.readouterr().err


def test_builtin_tiny_config_is_valid():
    cfg = load_run_config(builtin_config("tiny"))
    assert cfg.data.corpus == "shakespeare" and cfg.data.tokenizer == "byte"
    assert cfg.model.attention.core.name == "sdpa"


def test_macs_reproduces_the_paper_table_for_switchhead_47m(tmp_path, capsys):
    cfg = {"model": {"d_model": 412, "n_layers": 16, "d_ff": 2080, "max_seq_len": 512,
                     "memory_len": 256,
                     "attention": {"n_heads": 2, "d_head": 76,
                                   "projections": {"name": "switchhead", "n_experts": 5, "k": 2},
                                   "positions": {"name": "xl", "content_bias": False}}},
           "train": {"seq_len": 256}}
    path = dump_config(cfg, tmp_path / "sh.yaml")
    assert main(["macs", "--config", path, "--convention", "paper", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert round(cost["attention_macs"] / 1e6, 1) == 170.4
    assert round(cost["attention_memory_floats"] / 1e6, 1) == 0.8
    assert main(["macs", "--config", path]) == 0
    assert "attention_macs" in capsys.readouterr().out
