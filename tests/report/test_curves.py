"""Quality-curve reports over run directories."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main
from attnlab.report import curves_table, plot_curves, read_run


def _fake_run(path, curve, metric="eval_bpc", params=1000):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"params": params, metric: curve[-1][1]}))
    rows = [{"step": s, "loss": 3.0 - s / 1000} for s in range(10, 31, 10)]
    rows += [{"step": s, metric: v, "eval_tokens": 100} for s, v in curve]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_table_lists_every_evaluated_step(tmp_path):
    a = read_run(_fake_run(tmp_path / "a", [(10, 3.0), (30, 2.5)]))
    b = read_run(_fake_run(tmp_path / "b", [(10, 3.1), (20, 2.9), (30, 2.6)], params=2000),
                 name="bee")
    assert a.eval_curve == [(10, 3.0), (30, 2.5)] and len(a.train_curve) == 3
    table = curves_table([a, b])
    assert "bits per character" in table
    assert "| run | params | step 10 | step 20 | step 30 |" in table
    assert "| a | 1,000 | 3.000 |  | 2.500 |" in table
    assert "| bee | 2,000 | 3.100 | 2.900 | 2.600 |" in table


def test_mixed_metrics_and_missing_files_are_errors(tmp_path):
    a = read_run(_fake_run(tmp_path / "a", [(10, 3.0)]))
    b = read_run(_fake_run(tmp_path / "b", [(10, 30.0)], metric="eval_ppl"))
    assert b.metric == "eval_ppl"
    with pytest.raises(ValueError, match="different metrics"):
        curves_table([a, b])
    with pytest.raises(ValueError, match="no runs"):
        curves_table([])
    (tmp_path / "c").mkdir()
    with pytest.raises(FileNotFoundError, match="summary.json is missing"):
        read_run(tmp_path / "c")


def test_plot_and_cli(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    runs = [_fake_run(tmp_path / n, [(10, 3.0), (20, 2.7)]) for n in ("x", "y")]
    png = plot_curves([read_run(r) for r in runs], tmp_path / "p.png", title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "rep" / "q"
    assert main(["report", "--runs", *map(str, runs), "--names", "X", "Y", "--out",
                 str(out)]) == 0
    assert "| X |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 1000
    assert main(["report", "--runs", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "is not a finished run" in capsys.readouterr().err
