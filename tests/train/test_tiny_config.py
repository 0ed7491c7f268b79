import pytest

from attnlab.config import builtin_config
from attnlab.train import load_run_config, train


@pytest.mark.slow
def test_tiny_config_learns_shakespeare(tmp_path):
    """The shipped tiny config (the demo's dense baseline) learns well below 8 bits per byte."""
    cfg = load_run_config(builtin_config("tiny"), [f"data.cache_dir={tmp_path / 'cache'}"])
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["steps"] == cfg.train.steps
    assert summary["eval_bpc"] < 3.0
