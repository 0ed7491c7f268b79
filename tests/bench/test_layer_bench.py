import json

from attnlab.bench.layer import PRESETS, build_layer
from attnlab.cli import main


def test_bench_layer_compares_the_four_variants(tmp_path, capsys, monkeypatch):
    small = PRESETS["wt103-47m"].__class__(d_model=48, n_layers=2, seq_len=16,
                                           variants=PRESETS["wt103-47m"].variants)
    monkeypatch.setitem(PRESETS, "small", small)
    out = tmp_path / "layer.json"
    assert main(["bench", "layer", "--preset", "small", "--reps", "5", "--passes", "fwd",
                 "fwdbwd", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert {r["name"] for r in results} == {"dense-h10", "dense-h2", "switchhead", "moa"}
    for r in results:
        assert r["baseline"] == "dense-h10" and r["ratio"] > 0 and r["peak_mem_mb"] >= 0
        if r["name"] == "dense-h10":
            assert r["ratio"] == 1.0
    assert "switchhead" in capsys.readouterr().out


def test_paper_preset_layers_match_the_paper_heads():
    preset = PRESETS["wt103-47m"]
    layer = build_layer(preset, preset.variants["switchhead"], device="cpu")
    assert layer.ctx.n_heads == 2 and layer.ctx.d_head == 76
    dense = build_layer(preset, preset.variants["dense-h10"], device="cpu")
    # param-matched (the paper's recipe): within 3% of the dense H10 attention
    n_dense = sum(p.numel() for p in dense.parameters())
    n_switch = sum(p.numel() for p in layer.parameters())
    assert abs(n_switch - n_dense) / n_dense < 0.03
