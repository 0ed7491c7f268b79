import json

import pytest

from attnlab.bench.expert_matmul import FORCEABLE, run
from attnlab.cli import main


def test_bench_expert_matmul_writes_the_schema(tmp_path, capsys):
    out = tmp_path / "em.json"
    assert main(["bench", "expert-matmul", "--tokens", "64", "--reps", "5", "--naive-reps", "5",
                 "--passes", "fwd", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data) == {"machine", "results"}
    assert {"cpu", "threads", "gpu", "torch"} <= set(data["machine"])
    names = {(r["name"], r["shape"]["projection"]) for r in data["results"]}
    assert names == {(n, p) for n in ("fast", "naive", "dense-equal-macs") for p in "VO"}
    for r in data["results"]:
        assert r["pass"] == "fwd" and r["baseline"] == "dense-equal-macs"
        assert r["ms_median"] > 0 and r["ratio"] > 0
    assert "dense-equal-macs" in capsys.readouterr().out


def test_forced_backends_are_timed_beside_auto(tmp_path):
    out = tmp_path / "em.json"
    assert main(["bench", "expert-matmul", "--tokens", "64", "--reps", "5", "--passes", "fwd",
                 "--backends", "grouped", "dense", "--json", str(out)]) == 0
    names = {r["name"] for r in json.loads(out.read_text())["results"]}
    assert names == {"fast", "naive", "dense-equal-macs", "grouped", "dense"}


def test_the_cli_offers_every_forceable_backend(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "expert-matmul", "--backends", "auto"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert all(f"'{b}'" in err for b in FORCEABLE)
    with pytest.raises(ValueError, match="unknown backends \\['naive'\\]; valid: grouped"):
        run(tokens=8, backends=["naive"])
