"""Quality-curve reports over run directories."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.report import curves_table, plot_curves, read_run
from tests.report.fixtures import fake_run


def test_table_lists_every_evaluated_step(tmp_path):
    a = read_run(fake_run(tmp_path / "a", [(10, 3.0), (30, 2.5)]))
    b = read_run(fake_run(tmp_path / "b", [(10, 3.1), (20, 2.9), (30, 2.6)], params=2000),
                 name="bee")
    assert a.eval_curve == [(10, 3.0), (30, 2.5)] and len(a.train_curve) == 3
    table = curves_table([a, b])
    assert "bits per character" in table
    assert "| run | params | step 10 | step 20 | step 30 |" in table
    assert "| a | 1,000 | 3.000 |  | 2.500 |" in table
    assert "| bee | 2,000 | 3.100 | 2.900 | 2.600 |" in table


def test_mixed_metrics_and_missing_files_are_errors(tmp_path):
    a = read_run(fake_run(tmp_path / "a", [(10, 3.0)]))
    b = read_run(fake_run(tmp_path / "b", [(10, 30.0)], metric="eval_ppl"))
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
    runs = [fake_run(tmp_path / n, [(10, 3.0), (20, 2.7)]) for n in ("x", "y")]
    png = plot_curves([read_run(r) for r in runs], tmp_path / "p.png", title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "rep"
    assert main(["report", "--runs", *map(str, runs), "--out", str(out)]) == 0  # older usage
    assert "| x | 1,000 | 3.000 | 2.700 |" in (out / "report.md").read_text()
    assert (out / "quality.png").stat().st_size > 1000
    assert main(["report", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_training_time_comes_from_the_logged_throughput(tmp_path):
    run = read_run(fake_run(tmp_path / "a", [(10, 3.0), (30, 2.5)], tokens_per_step=64,
                            tokens_per_s=640.0))
    assert run.tokens_per_step == 64
    assert run.train_time == [(10, 1.0), (20, 2.0), (30, 3.0)]
    assert run.seconds_at(15) == pytest.approx(1.5) and run.seconds_at(5) == pytest.approx(0.5)
    assert run.seconds_at(31) is None
