import json
from pathlib import Path

import pytest

import attnlab
from attnlab.bench.train_step import run
from attnlab.models import DecoderLM
from attnlab.train import train
from attnlab.train.config import load_run_config

TINY = Path(attnlab.__file__).parent / "configs" / "tiny"
NAMES = ("dense-h8", "dense-h2", "switchhead", "switchall", "moa")
SMALL = ("train.batch_size=2", "train.seq_len=32", "model.memory_len=32")


def test_train_bench_records_follow_the_schema(tmp_path):
    out = tmp_path / "train.json"
    records = run(
        [TINY / "dense-h8.yaml", TINY / "switchhead.yaml"], steps=5, overrides=SMALL, json_path=out
    )
    assert [r.name for r in records] == ["dense-h8", "switchhead"]
    for r in records:
        assert r.bench == "train" and r.pass_ == "fwdbwd" and r.baseline == "dense-h8"
        assert r.ms_median > 0 and r.ms_min > 0 and r.ms_min <= r.ms_median
        assert r.peak_mem_mb >= 0 and r.ratio > 0
        assert r.shape["params"] > 0
        assert {k: r.shape[k] for k in ("batch", "seq_len", "memory_len", "tokens_per_step")} == {
            "batch": 2,
            "seq_len": 32,
            "memory_len": 32,
            "tokens_per_step": 64,
        }
        expected = 64 / (r.ms_median / 1e3)  # tokens_per_s is stored to 0.1
        assert r.shape["tokens_per_s"] == pytest.approx(expected, rel=1e-3, abs=0.05)
    assert records[0].ratio == 1.0
    data = json.loads(out.read_text())
    assert set(data) == {"machine", "results"}
    assert [r["name"] for r in data["results"]] == ["dense-h8", "switchhead"]
    assert all(r["pass"] == "fwdbwd" for r in data["results"])


def test_train_bench_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        run([TINY / "dense-h8.yaml", tmp_path / "nope.yaml"])
    with pytest.raises(ValueError, match="dense-h8"):
        run([TINY / "dense-h8.yaml", TINY / "dense-h8.yaml"])
    with pytest.raises(ValueError, match="at least 5"):
        run([TINY / "dense-h8.yaml"], steps=2, overrides=SMALL)


def test_tiny_configs_are_param_matched_to_dense_h8():
    def params(name: str) -> int:
        cfg = load_run_config(TINY / f"{name}.yaml", ["model.vocab_size=256"])
        return DecoderLM(cfg.model).num_params()

    ref = params("dense-h8")
    for name in NAMES[1:]:
        assert abs(params(name) - ref) / ref < 0.005, name


@pytest.mark.parametrize("name", NAMES)
def test_tiny_config_trains_three_steps(name, tmp_path):
    cfg = load_run_config(
        TINY / f"{name}.yaml",
        [
            "train.steps=3",
            "train.eval_every=0",
            "train.final_eval_tokens=2048",
            f"data.cache_dir={tmp_path / 'cache'}",
        ],
    )
    assert cfg.model.memory_len == cfg.train.seq_len
    assert cfg.model.max_seq_len >= 2 * cfg.train.seq_len
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["steps"] == 3 and summary["eval_loss"] > 0


def test_bench_train_cli(tmp_path, capsys):
    from attnlab.cli import main

    out = tmp_path / "train.json"
    assert main(["bench", "train", "--configs", "tiny/dense-h8", "tiny/switchhead", "--steps",
                 "5", "--set", "train.batch_size=2", "--set", "train.seq_len=16",
                 "--set", "model.memory_len=16", "--json", str(out)]) == 0
    names = [r["name"] for r in json.loads(out.read_text())["results"]]
    assert names == ["dense-h8", "switchhead"]
    assert "switchhead" in capsys.readouterr().out
