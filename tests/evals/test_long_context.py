"""attnlab long-context end to end on a tiny random Llama folder: records, ratios, the
student variant, the table, and bad input (one error line, exit 2, nothing written)."""

from __future__ import annotations

import json

import pytest

import attnlab.hf
from attnlab.bench.hf import tiny_tokenizer
from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.evals import long_context
from attnlab.evals.long_context import LongContextConfig, format_table, run
from attnlab.evals.models import Models
from attnlab.evals.variants import parse_variant
from attnlab.utils.provenance import available_cores, model_fingerprint
from tests.hf.models import save_model

SMALL = LongContextConfig(lengths=(256, 320), ppl_tokens=200, depths=(0.1, 0.9), prompts=2)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_model("llama", tmp_path_factory.mktemp("llama"), tiny_tokenizer(),
                      max_position_embeddings=512)


@pytest.fixture(scope="module")
def student(llama, tmp_path_factory):
    """A SEA student folder whose position tables were 'trained' on 128 ranks."""
    model = attnlab.hf.convert(attnlab.hf.load(llama), "sea", {"k": 8, "predictor_length": 8})
    model.config.attnlab["trained_seq_len"] = 128
    folder = tmp_path_factory.mktemp("student")
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def result(llama, student):
    variants = ["original", "{name: window, sinks: 2, window: 30}", "{name: oracle, k: 16}",
                f"{{name: sea, student: {student}, k: 4}}"]
    return run(llama, variants, SMALL, progress=False)


def test_every_variant_has_every_cell_and_ratios_to_the_original(result):
    records = result["records"]
    assert len(records) == 4 * 2 * (1 + 2)  # variants x lengths x (perplexity + 2 depths)
    labels = [v["label"] for v in result["variants"]]
    assert labels == ["original", "window 32", "oracle 16", "sea student 4"]
    for r in records:
        if r["task"] == "perplexity":
            assert r["tokens"] >= 200 and r["ppl"] > 1 and r["ppl_ratio"] > 0
            assert r["stride"] == r["seq_len"] // 2
        else:
            assert r["prompts"] == 2 and r["inconclusive"]
            assert r["original_fails"]  # a random model cannot retrieve anything
    original = [r for r in records if r["variant"] == "original" and r["task"] == "perplexity"]
    assert all(r["ppl_ratio"] == 1.0 for r in original)
    window = [r for r in records if r["variant"] == "window 32" and r["task"] == "perplexity"]
    assert all(r["ppl_ratio"] != 1.0 for r in window)  # a 32-key window changes the model


def test_records_carry_the_common_fields_and_paired_intervals(result):
    for r in result["records"]:
        assert r["bench"] == "long-context" and r["budget"] == r["keys_per_row"]
        assert r["protocol"] == "sparse"
        if r["task"] == "perplexity":
            assert len(r["window_nll"]) == len(r["window_tokens"]) >= 1
            assert sum(r["window_tokens"]) == r["tokens"]
            low, high = r["ppl_ratio_ci95"]
            assert low <= r["ppl_ratio"] <= high


def test_dense_prefill_serves_every_variant_and_the_original_answers_as_in_full(llama):
    cfg = LongContextConfig(lengths=(256,), tasks=("passkey",), depths=(0.5,), prompts=3,
                            passkey_protocols=("sparse", "dense-prefill"))
    out = run(llama, ["original", "{name: window, sinks: 2, window: 14}"], cfg, progress=False)
    cells = {(r["variant"], r["protocol"]): r for r in out["records"]}
    assert set(cells) == {(v, p) for v in ("original", "window 16")
                          for p in ("sparse", "dense-prefill")}
    assert cells["original", "dense-prefill"]["correct"] == cells["original", "sparse"]["correct"]
    assert all(r["prompts"] == 3 for r in out["records"])
    assert "passkey (dense prefill) @50%" in format_table(out)


def test_the_table_lists_every_variant_and_marks_small_samples(result):
    table = format_table(result)
    assert table.count("| sea student 4 | 4 |") == 2
    assert "0/2 (original fails)*" in table and "inconclusive" in table


def test_default_labels_tell_page_sizes_apart():
    """Two variants that differ only in their page size get different labels (the report
    draws one budget curve per label); the core's default page is not named."""
    labels = [parse_variant(spec).label for spec in
              ("{name: oracle, k: 64}", "{name: oracle, k: 64, page: 16}",
               "{name: quest, budget: 64, page: 8}", "{name: quest, budget: 64, page: 16}",
               "{name: oracle, k: 64, label: mine}")]
    assert labels == ["oracle 64", "oracle p16 64", "quest p8 64", "quest 64", "mine"]


def test_a_student_reads_its_trained_positions_stretched(student, llama):
    variant = parse_variant(f"{{name: sea, student: {student}}}")
    models = Models(attnlab.hf.load(llama))
    model = models.build(variant)
    longer = models.at_length(variant, model, 300)  # ceil(300 / 128) = 3
    table = next(p for n, p in model.named_parameters() if n.endswith("position_table"))
    stretched = next(p for n, p in longer.named_parameters() if n.endswith("position_table"))
    assert stretched[7].equal(table[2]) and not stretched[7].equal(table[7])
    assert models.at_length(variant, model, 128) is model


@pytest.mark.parametrize(("args", "message"), [
    (["--lengths", "1024"], "outside the model's positions"),
    (["--variant", "{name: window, window: 400}"], "not fewer than the context"),
    (["--variant", "{name: window, window: 0}"], "window must be >= 1"),
    (["--variant", "{name: oracle, kk: 3}"], "kk"),
    (["--variant", "{name: sea, student: /nonexistent}"], "not a student folder"),
    (["--variant", "{name: sea, k: 4}"], "would run untrained"),
    (["--variant", "{name: sea_pages, budget: 32, page: 4}"], "runs on distilled estimators"),
    (["--variant", "{name: sea_pages, budget: 32, page: 4, estimators: nope}"],
     "no shipped set"),
    (["--passkey-protocols", "dense"], "passkey protocols must be among"),
    (["--variant", "{name: oracle}"], "keeps 256 keys per row"),  # its default k counts
    (["--lengths", "128"], "a passkey prompt needs at least"),
    (["--depths", "1.5"], "depth must be between 0 and 1"),
    (["--tasks", "ppl"], "tasks must be some of"),
    (["--stride", "1.0"], "stride"),
])
def test_bad_input_is_one_error_line_and_writes_nothing(llama, tmp_path, capsys, args, message):
    out = tmp_path / "out.json"
    code = main(["long-context", "--model", str(llama), "--json", str(out), "--quiet",
                 "--lengths", "256", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not out.exists()


def test_no_document_longer_than_the_context_is_an_error(llama, monkeypatch):
    class Short:
        def read_documents(self, split):
            yield "a", "too short"

    monkeypatch.setattr(long_context, "open_source", lambda cfg: Short())
    with pytest.raises(ConfigError, match="no document of corpus 'shakespeare'"):
        run(llama, ["original"], LongContextConfig(lengths=(256,), tasks=("perplexity",)),
            progress=False)


def test_a_document_cap_takes_the_sample_from_several_documents(llama, capsys):
    """Windows of 128 targets at 256 tokens, at most 100 targets per document: 300 targets
    take the first window of three documents."""
    cfg = LongContextConfig(lengths=(256,), tasks=("perplexity",), ppl_tokens=300,
                            ppl_document_tokens=100)
    result = run(llama, ["original"], cfg, progress=False)
    (record,) = result["records"]
    assert record["documents"] == 3 and record["window_tokens"] == [128] * 3
    assert result["config"]["ppl_document_tokens"] == 100
    with pytest.raises(ConfigError, match="ppl_document_tokens must be >= 1"):
        LongContextConfig(ppl_document_tokens=0).validate()
    with pytest.raises(SystemExit) as stop:
        main(["long-context", "--model", str(llama), "--ppl-document-tokens", "0"])
    assert stop.value.code == 2 and "--ppl-document-tokens" in capsys.readouterr().err


def test_the_cli_prints_the_table_and_saves_json(llama, tmp_path, capsys):
    out = tmp_path / "lc.json"
    assert main(["long-context", "--model", str(llama), "--lengths", "256", "--tasks",
                 "perplexity", "--ppl-tokens", "100", "--variant", "original", "--variant",
                 "{name: oracle, k: 8, label: top8}", "--json", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "| top8 | 8 | 256 |" in printed
    saved = json.loads(out.read_text())
    assert [r["variant"] for r in saved["records"]] == ["original", "top8"]
    assert saved["model_sha256"] == model_fingerprint(llama)
    assert f"model: {llama} (fingerprint {saved['model_sha256']})" in printed
    assert saved["cores"] == available_cores() and saved["threads"] >= 1
    assert all(r["documents"] >= 1 and r["tokens"] >= 100 and not r["inconclusive"]
               for r in saved["records"])
