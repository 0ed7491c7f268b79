"""Every figure is traceable to the model and the work that produced it (issue #32): input
that would print a number that is not what it claims is one ``error:`` line, exit status 2,
no traceback and nothing written; figures of less work than asked are marked where they are
printed; records name their model, and figures of different models are never joined."""

from __future__ import annotations

import json
import logging
import sys

import pytest
import torch

pytest.importorskip("transformers")

from attnlab.bench import bias  # noqa: E402
from attnlab.bench.hf import tiny_tokenizer  # noqa: E402
from attnlab.cli import main  # noqa: E402
from attnlab.evals import long_context  # noqa: E402
from attnlab.layers import CORES, POSITIONS  # noqa: E402
from attnlab.layers.base import CoreOutput  # noqa: E402
from attnlab.layers.cores import DenseCore, ScoreOptions  # noqa: E402
from attnlab.ops.attention import sdpa_attention  # noqa: E402
from attnlab.utils.provenance import available_cores, model_fingerprint  # noqa: E402
from tests.cli.test_errors import assert_user_error, cli  # noqa: E402
from tests.hf.models import save_model  # noqa: E402

SERVE = ["bench", "serve", "--batches", "1", "--prefill-batches", "", "--steps", "1",
         "--warmup", "1", "--reps", "1"]
WINDOW = "{name: window, sinks: 2, window: 30}"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_model("llama", tmp_path_factory.mktemp("llama"), tiny_tokenizer(),
                      max_position_embeddings=512)


@pytest.fixture(scope="module")
def other_llama(tmp_path_factory):
    """Another model: the same architecture, a narrower MLP."""
    return save_model("llama", tmp_path_factory.mktemp("other"), tiny_tokenizer(),
                      max_position_embeddings=512, intermediate_size=48)


def assert_refused(argv, tmp_path, capsys, *words):
    """``argv`` (with ``--json`` into ``tmp_path``) is one user error that writes nothing."""
    assert_user_error([*argv, "--json", tmp_path / "out.json"], capsys, *words)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------- refused before any work


@pytest.mark.parametrize("extra", [1, 998])
def test_threads_beyond_the_cores_are_refused(extra, tmp_path, capsys):
    cores = available_cores()
    threads = cores + extra  # 1000 on the 2-core machine
    argv = [*SERVE, "--threads", threads, "--seq-lens", "64", "--plot", tmp_path / "p.png"]
    assert_refused(argv, tmp_path, capsys, f"{threads} threads on {cores} CPU cores",
                   f"at most {cores}")


@pytest.mark.parametrize(("command", "variant", "words"), [
    ("serve", "{name: sea, k: 256, predictor_length: 8}",
     "core sea keeps 256 keys per row, not fewer than the context 128"),
    ("serve", "{name: window, window: 10000}", "core window keeps 10004 keys per row"),
    ("long-context", "{name: window, window: 10000}",
     "variant 'window 10004' keeps 10004 keys per row, not fewer than the context 128"),
    ("long-context", "{name: oracle, k: 128}", "keeps 128 keys per row, not fewer than"),
])
def test_budgets_not_below_the_context_are_refused_by_both_commands(
        command, variant, words, llama, tmp_path, capsys):
    argv = ([*SERVE, "--core", variant, "--seq-lens", "128,256"] if command == "serve" else
            ["long-context", "--model", llama, "--lengths", "256,128", "--variant", variant,
             "--quiet"])
    assert_refused(argv, tmp_path, capsys, words, "dense attention there")


def test_an_untrained_sea_is_refused_naming_how_to_get_a_student(llama, tmp_path, capsys):
    argv = ["long-context", "--model", llama, "--lengths", "256", "--variant", "original",
            "--variant", "{name: sea, k: 8}", "--quiet"]
    assert_refused(argv, tmp_path, capsys, "would run untrained", "attnlab distill",
                   "--student-attention sea", "student: OUT/student")


@pytest.fixture
def no_bias_plugin(tmp_path_factory, monkeypatch):
    """A ``--plugin`` module registering ``nobias``: declares the score_bias trait and
    returns none."""
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "nobias_plugin.py").write_text(
        "from attnlab.layers import POSITIONS, Positions\n"
        "from attnlab.layers.registry import NoOptions\n\n\n"
        "@POSITIONS.register('nobias', NoOptions, score_bias=True)\n"
        "def _nobias(ctx, options):\n"
        "    return Positions()\n")
    monkeypatch.syspath_prepend(folder)
    monkeypatch.delitem(sys.modules, "nobias_plugin", raising=False)
    yield
    POSITIONS.unregister("nobias")


def test_a_bias_scheme_that_returns_none_is_refused(no_bias_plugin, tmp_path, capsys):
    argv = ["--plugin", "nobias_plugin", "bench", "bias", "--positions", "alibi,nobias",
            "--seq-lens", "64", "--heads", "2", "--d-head", "8"]
    assert_refused(argv, tmp_path, capsys, "positions 'nobias' declares the score_bias trait "
                                           "but returns no bias")


@pytest.fixture
def deaf_core(monkeypatch):
    """A core that declares the score_bias trait and drops the bias, as a ``+bias``
    candidate."""
    class Deaf(DenseCore):
        def forward(self, q, k, v, *, scale, key_padding_mask=None, score_bias=None,
                    state=None):
            return CoreOutput(sdpa_attention(q, k, v, scale=scale, causal=True))

    CORES.register("deaf", ScoreOptions, score_bias=True)(
        lambda ctx, options, dropout: Deaf(ctx, options, dropout, sdpa_attention))
    monkeypatch.setattr(bias, "CANDIDATES", {"sdpa": ("sdpa", False),
                                             "sdpa+bias": ("sdpa", True),
                                             "eager+bias": ("eager", True)})
    yield
    CORES.unregister("deaf")


def test_a_bias_row_is_only_reported_where_the_bias_was_applied(deaf_core, monkeypatch):
    def outputs():
        with torch.no_grad():
            return {n: f() for n, f in bias._forwards("alibi", 32, 2, 8, 1).items()}

    bias.check_applied(outputs(), "alibi")  # sdpa and eager apply it
    monkeypatch.setitem(bias.CANDIDATES, "deaf+bias", ("deaf", True))
    with pytest.raises(ValueError, match="deaf\\+bias: the deaf core gave the same output "
                                         "with the 'alibi' bias as without it"):
        bias.check_applied(outputs(), "alibi")


# ------------------------------------------------------------- marked where printed


class FewLongDocuments:
    """A corpus of 4 documents, 3 of them shorter than the context."""

    def read_documents(self, split):
        yield "long", "the quick brown fox jumps over the lazy dog " * 40
        for i in range(3):
            yield f"short {i}", "the lazy dog"


def test_a_perplexity_of_fewer_documents_and_tokens_than_asked_is_marked(
        llama, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(long_context, "open_source", lambda cfg: FewLongDocuments())
    out = tmp_path / "lc.json"
    assert main(["long-context", "--model", str(llama), "--lengths", "256", "--tasks",
                 "perplexity", "--ppl-tokens", "100000", "--json", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    (record,) = saved["records"]
    assert record["documents"] == 1 and record["skipped_documents"] == 3
    assert record["inconclusive"] and record["tokens"] < 100000
    assert record["shortfall"] == (f"1 of 4 documents (3 not longer than 256 tokens); "
                                   f"{record['tokens']} of 100000 tokens: inconclusive")
    assert f"| original | all | 256 | {record['ppl']:.3f} † |" in printed
    assert f"† at T=256: {record['shortfall']}" in printed


# ------------------------------------------------------------- traceable and never mixed


def test_records_name_their_model_and_only_one_models_figures_are_joined(
        llama, other_llama, tmp_path, capsys, caplog):
    paths = {name: tmp_path / f"{name}.json" for name in ("serve", "other", "lc")}
    for model, path in ((llama, paths["serve"]), (other_llama, paths["other"])):
        assert cli([*SERVE, "--threads", "1", "--model", model, "--core", WINDOW,
                    "--seq-lens", "256", "--json", path], capsys)[0] == 0
    assert cli(["long-context", "--model", llama, "--lengths", "256", "--tasks", "perplexity",
                "--ppl-tokens", "100", "--variant", "original", "--variant", WINDOW,
                "--json", paths["lc"], "--quiet"], capsys)[0] == 0

    serve = json.loads(paths["serve"].read_text())
    assert serve["machine"]["threads"] == 1
    assert serve["machine"]["cores"] == available_cores()
    assert {r["shape"]["model_sha256"] for r in serve["results"]} == {model_fingerprint(llama)}
    assert [r["shape"]["keys_per_row"] for r in serve["results"]] == [None, 32]
    other = json.loads(paths["other"].read_text())["results"][0]["shape"]["model_sha256"]
    assert other == model_fingerprint(other_llama) != model_fingerprint(llama)
    lc = json.loads(paths["lc"].read_text())
    assert lc["model_sha256"] == model_fingerprint(llama)
    assert {r["tokens"] >= 100 and r["documents"] >= 1 for r in lc["records"]} == {True}

    def report(serve_path, out):
        assert cli(["report", paths["lc"], serve_path, "--out", out], capsys)[0] == 0
        return (json.loads((out / "results.json").read_text())["frontier"],
                (out / "report.md").read_text())

    frontier, _ = report(paths["serve"], tmp_path / "joined")
    window = next(p for p in frontier if p["variant"] == "window 32")
    assert window["decode_speedup"] > 0
    with caplog.at_level(logging.WARNING, logger="attnlab.report.frontier"):
        frontier, text = report(paths["other"], tmp_path / "apart")
    assert all("decode_speedup" not in p for p in frontier)
    warning = (f"the serve records of `{other_llama.name}` (fingerprint `{other}`) are not "
               "this model's")
    assert f"**Warning**: {warning}" in text
    assert any(warning in r.getMessage() for r in caplog.records)  # and in the log


def test_a_folder_whose_files_changed_is_another_model(llama, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in llama.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert model_fingerprint(copy) == model_fingerprint(llama)  # the same files anywhere
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "rope_theta": 1.0}))
    assert model_fingerprint(copy) != model_fingerprint(llama)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    (copy / "config.json").write_text(json.dumps(config))
    weights.write_bytes(bytes(data))
    assert model_fingerprint(copy) != model_fingerprint(llama)
