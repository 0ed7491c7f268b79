"""A core registered from a user's module, with no edit in attnlab, is counted by ``attnlab
macs``, measured by ``attnlab long-context`` and drawn with its own marker by the report:
what those need (a MAC formula, a budget, a marker) is declared at registration."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main
from attnlab.layers import CORES
from tests.helpers import dump_config, plugin_module

PLUGIN = '''
from attnlab.layers import CORES
from attnlab.layers.window import WindowCore, WindowOptions


def my_window_cost(shape, options):
    keys = min(shape.tk, options.sinks + options.window)
    return 2 * shape.h * shape.t * keys * shape.dh, 2 * shape.h * shape.t * keys


@CORES.register("my_window", WindowOptions, score_bias=True, budget=("sinks", "window"),
                cost=my_window_cost, marker="p")
def _my_window(ctx, options, dropout):
    """Sinks and a window, registered from a plugin."""
    return WindowCore(options)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    with plugin_module(tmp_path, monkeypatch, "my_cores", PLUGIN, CORES, "my_window") as name:
        yield name


def macs_of(core, tmp_path, capsys, plugin):
    config = dump_config({"model": {"d_model": 64, "n_layers": 2, "d_ff": 128,
                                    "attention": {"n_heads": 2, "core": core}},
                          "train": {"seq_len": 64}}, tmp_path / f"{len(str(core))}.yaml")
    assert main(["--plugin", plugin, "macs", "--config", str(config), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_macs_counts_a_plugin_core_by_its_declared_formula(plugin, tmp_path, capsys):
    dense = macs_of("sdpa", tmp_path, capsys, plugin)
    sparse = macs_of({"name": "my_window", "sinks": 2, "window": 14}, tmp_path, capsys, plugin)
    h, t, dh = 2, 64, 32
    scores = 2 * h * t * dh  # q k^T and attn v, per key read
    assert dense["attention_macs"] - sparse["attention_macs"] == scores * (t - 16)


def test_a_core_without_a_formula_is_refused_by_name(tmp_path, capsys):
    config = dump_config({"model": {"attention": {"core": "performer"}}}, tmp_path / "p.yaml")
    assert main(["macs", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "no MAC accounting for core 'performer'" in err and "cost=" in err


def test_long_context_measures_a_plugin_core(plugin, tmp_path, capsys):
    pytest.importorskip("transformers")
    from attnlab.bench.hf import tiny_tokenizer
    from tests.hf.models import save_model

    llama = save_model("llama", tmp_path / "llama", tiny_tokenizer(),
                       max_position_embeddings=512)
    out = tmp_path / "lc.json"
    assert main(["--plugin", plugin, "long-context", "--model", str(llama), "--lengths", "256",
                 "--tasks", "perplexity", "--ppl-tokens", "100", "--variant", "original",
                 "--variant", "{name: my_window, sinks: 2, window: 30}", "--json", str(out),
                 "--quiet"]) == 0
    records = json.loads(out.read_text())["records"]
    mine = [r for r in records if r["variant"] != "original"]
    assert [r["keys_per_row"] for r in mine] == [32] and mine[0]["ppl_ratio"] > 0


def test_the_report_draws_a_plugin_core_with_its_marker(plugin):
    from attnlab.cli.plugins import import_plugins
    from attnlab.report.frontier_plots import marker

    import_plugins([plugin])
    assert marker("my_window") == "p"
    assert marker("sea_pages") == "h" and marker("original") == "*"
    assert marker("not_registered") == CORES.known_traits["marker"][0]
