"""``attnlab bench bias``: records with ratios to unbiased SDPA, and the flex compile time."""

from __future__ import annotations

import json

from attnlab.cli import main


def test_cli_writes_records_with_ratios(tmp_path, capsys):
    out = tmp_path / "bias.json"
    assert main(["bench", "bias", "--positions", "alibi", "--seq-lens", "128", "--heads", "2",
                 "--d-head", "16", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["name"] for r in results] == ["sdpa", "sdpa+bias", "eager+bias", "flex+bias", "sea",
                                              "sea+bias"]
    assert results[0]["ratio"] == 1.0 and all(r["ratio"] > 0 for r in results)
    assert results[0]["shape"]["flex_compile_s"] >= 0
    assert "flex+bias" in capsys.readouterr().out


def test_a_scheme_without_a_bias_is_refused(capsys):
    assert main(["bench", "bias", "--positions", "rope"]) == 2
    assert "adds no score bias; choose from ['alibi', 'xl']" in capsys.readouterr().err
