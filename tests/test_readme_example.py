"""The documentation's examples, run as a user would: the README's "your own variant" (its code
block saved as a module, loaded with ``attnlab --plugin``, trained next to SwitchHead
projections) and SEA's token importance in docs/attention.md (on a small SEA run)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.layers import POSITIONS, Attention, AttentionConfig, LayerContext
from tests.helpers import dump_config, plugin_module

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# where each example lives
EXAMPLES = {"own-variant": README, "token-importance": ROOT / "docs" / "attention.md"}


def example_code(name: str = "own-variant") -> str:
    page = EXAMPLES[name]
    text = page.read_text()
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"{page.relative_to(ROOT)} lost its {name} example"
    return match.group(1)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    with plugin_module(tmp_path, monkeypatch, "my_variants", example_code(), POSITIONS,
                       "log_decay") as name:
        yield name


def test_the_example_is_about_twenty_lines():
    lines = [line for line in example_code().splitlines() if line.strip()]
    assert len(lines) <= 22


def test_a_registered_variant_trains_from_the_cli(plugin, tiny_run_config, tmp_path, capsys):
    cfg = tiny_run_config(steps=3)
    cfg["model"]["attention"] = {
        "n_heads": 2, "projections": {"name": "switchhead", "n_experts": 4, "k": 2},
        "positions": {"name": "log_decay", "rate": 0.3}, "core": "flex"}
    config = dump_config(cfg, tmp_path / "cfg.yaml")
    assert main(["--plugin", plugin, "train", "--config", str(config), "--out",
                 str(tmp_path / "run"), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 3 and summary["eval_loss"] > 0
    # and it keeps the layer contract: cached decoding equals the full pass
    ctx = LayerContext(d_model=32, n_heads=2, max_seq_len=64)
    layer = Attention(ctx, AttentionConfig(n_heads=2, positions="log_decay",
                                           core="eager")).double().eval()
    x = torch.randn(1, 9, 32, dtype=torch.float64)
    prefix = layer(x[:, :5], use_cache=True)
    rest = layer(x[:, 5:], cache=prefix.cache).hidden
    torch.testing.assert_close(torch.cat((prefix.hidden, rest), 1), layer(x).hidden,
                               rtol=0, atol=1e-12)


def test_attnlab_macs_counts_the_registered_variant(plugin, tmp_path, capsys):
    def floats(positions):
        config = dump_config({"model": {"d_model": 64, "n_layers": 2, "attention": {
            "n_heads": 2, "positions": positions, "core": "eager"}},
            "train": {"seq_len": 64}}, tmp_path / "macs.yaml")
        assert main(["--plugin", plugin, "macs", "--config", str(config), "--json"]) == 0
        return json.loads(capsys.readouterr().out)["attention_memory_floats"]

    # its declared cost: one [H, T, Tk] bias table more than no positions
    assert floats({"name": "log_decay", "rate": 0.3}) - floats("none") == 2 * 64 * 64


def test_an_unknown_plugin_is_one_line(capsys):
    assert main(["--plugin", "no_such_variants", "macs", "--config", "tiny"]) == 2
    assert "--plugin no_such_variants: cannot import it" in capsys.readouterr().err


def test_the_token_importance_example_runs(tiny_run_config, tmp_path, capsys):
    from attnlab.train import load_run_config, train

    cfg = tiny_run_config(steps=2, eval_every=0, final_eval_tokens=512)
    cfg["model"]["attention"]["core"] = {"name": "sea", "k": 4, "predictor_length": 8}
    train(load_run_config(base=cfg), tmp_path / "sea", progress=False)
    code = example_code("token-importance").replace('"runs/sea"', repr(str(tmp_path / "sea")))
    exec(compile(code, "docs/attention.md token-importance example", "exec"), {})
    top = ast.literal_eval(capsys.readouterr().out.strip())
    assert len(top) == 5 and all(isinstance(token, str) for token in top)
