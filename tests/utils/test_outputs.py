"""The write policy (attnlab.utils.outputs): what a command may write over, and how."""

from __future__ import annotations

import json
import os
import stat

import pytest

from attnlab.utils.io import atomic_write_text, write_folder
from attnlab.utils.outputs import (
    OWNER_FILE,
    OutputFolder,
    OutputRefused,
    check_output_file,
    describe_folder,
    file_kind,
    folder_owner,
)
from tests.helpers import tree_checksums


def _fill(names):
    def fill(folder):
        for name in names:
            (folder / name).write_text(name)
    return fill


def test_a_new_folder_is_written_whole_and_marked_as_the_commands(tmp_path):
    out = OutputFolder.of(tmp_path / "hf", "export")
    out.check()
    out.write(_fill(["config.json", "model.bin"]))
    owner = json.loads((tmp_path / "hf" / OWNER_FILE).read_text())
    assert owner["command"] == "export"
    assert owner["files"] == ["config.json", "model.bin"]
    assert folder_owner(tmp_path / "hf") == "export"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_rewriting_its_own_folder_replaces_it_and_drops_files_it_no_longer_writes(tmp_path):
    OutputFolder.of(tmp_path / "hf", "export").write(_fill(["a", "b"]))
    out = OutputFolder.of(tmp_path / "hf", "export")
    out.check()
    out.write(_fill(["a"]))
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [OWNER_FILE, "a"]


@pytest.mark.parametrize("holding, words", [
    ({"config.yaml": "model: {}", "summary.json": "{}"}, "attnlab training run"),
    ({"distill.yaml": "distill: {}"}, "attnlab distillation"),
    ({"plan.json": "{}"}, "attnlab demo"),
    ({"report.md": "#", "results.json": "{}"}, "attnlab report"),
    ({"config.json": '{"model_type": "llama"}'}, "Hugging Face model folder"),
    ({"notes.txt": "mine"}, "1 entry attnlab did not write"),
])
def test_a_folder_another_command_made_is_refused_without_force(tmp_path, holding, words):
    folder = tmp_path / "x"
    folder.mkdir()
    for name, text in holding.items():
        (folder / name).write_text(text)
    before = tree_checksums(folder)
    with pytest.raises(OutputRefused, match="--force") as err:
        OutputFolder.of(folder, "export").check()
    assert words in str(err.value)
    assert describe_folder(folder) in str(err.value)
    assert tree_checksums(folder) == before


def test_force_writes_beside_foreign_files_and_keeps_them(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "model.bin").write_text("old")
    out = OutputFolder.of(folder, "export", force=True)
    out.check()
    out.write(_fill(["model.bin", "vocab.txt"]))
    assert (folder / "notes.txt").read_text() == "mine"
    assert (folder / "model.bin").read_text() == "model.bin"
    assert not (folder / OWNER_FILE).exists()  # a forced write does not claim the folder
    assert folder_owner(folder) is None


def test_an_input_folder_is_never_an_output_and_its_parent_only_with_force(tmp_path):
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "tokenizer.json").write_text("the run's")
    with pytest.raises(OutputRefused, match="folder this command reads"):
        OutputFolder.of(run, "export", force=True, inputs=[run]).check()
    with pytest.raises(OutputRefused, match="which this command reads"):
        OutputFolder.of(tmp_path / "runs", "export", inputs=[run]).check()
    OutputFolder.of(tmp_path / "runs", "export", force=True, inputs=[run]).check()
    # forced into the run's parent: the run is untouched
    OutputFolder.of(tmp_path / "runs", "export", force=True, inputs=[run]).write(
        _fill(["tokenizer.json"]))
    assert (run / "tokenizer.json").read_text() == "the run's"


def test_a_forced_write_never_replaces_an_input_file(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("input")
    out = OutputFolder.of(folder, "export", force=True, inputs=[folder / "tokenizer.json"])
    with pytest.raises(OutputRefused, match="would replace"):
        out.write(_fill(["tokenizer.json"]))
    assert (folder / "tokenizer.json").read_text() == "input"
    assert [p.name for p in tmp_path.iterdir()] == ["x"]  # the temporary folder is gone

    def into_the_run(tmp):
        (tmp / "run").mkdir()
        (tmp / "run" / "a").write_text("x")

    (folder / "run").mkdir()  # nor a file inside an input folder
    out = OutputFolder.of(folder, "export", force=True, inputs=[folder / "run"])
    with pytest.raises(OutputRefused, match="would replace"):
        out.write(into_the_run)
    assert not (folder / "run" / "a").exists()


def test_the_current_folder_is_written_file_by_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = OutputFolder.of(".", "export")
    out.check()
    out.write(_fill(["config.json"]))
    assert (tmp_path / "config.json").is_file()
    assert folder_owner(tmp_path) == "export"
    assert os.getcwd() == str(tmp_path)


def test_a_failing_fill_leaves_the_old_folder_and_no_temporary_one(tmp_path):
    OutputFolder.of(tmp_path / "hf", "export").write(_fill(["a"]))
    before = tree_checksums(tmp_path / "hf")

    def broken(folder):
        (folder / "a").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        OutputFolder.of(tmp_path / "hf", "export").write(broken)
    assert tree_checksums(tmp_path / "hf") == before
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]
    with pytest.raises(RuntimeError):
        write_folder(tmp_path / "new", broken)
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_claim_marks_only_a_folder_the_command_owns(tmp_path):
    OutputFolder.of(tmp_path / "r", "report").claim()
    assert folder_owner(tmp_path / "r") == "report"
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "notes.txt").write_text("mine")
    OutputFolder.of(tmp_path / "f", "report", force=True).claim()
    assert not (tmp_path / "f" / OWNER_FILE).exists()


def test_a_file_is_not_a_folder_output(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputRefused, match="is a file"):
        OutputFolder.of(tmp_path / "f", "report", force=True).check()


# ---------------------------------------------------------------- single files


def test_file_kinds_recognise_what_attnlab_wrote(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"machine": {}, "results": []}))
    match = tmp_path / "m.json"
    match.write_text(json.dumps({"written_by": "attnlab match"}))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"steps": 3}))
    config = tmp_path / "m.yaml"
    config.write_text("# Matched by `attnlab match` to tiny\nmodel: {}\n")
    other = tmp_path / "other.yaml"
    other.write_text("model: {}\n")
    assert [file_kind(p) for p in (bench, match, summary, config, other)] == [
        "json", "json", None, "yaml", None]


def test_file_kinds_of_figures(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnlab.results.figures import save_figure

    ours = save_figure(plt.figure(), tmp_path / "ours.png")
    theirs = tmp_path / "theirs.png"
    plt.figure().savefig(theirs)
    assert file_kind(ours) == "png"
    assert file_kind(theirs) is None


@pytest.mark.parametrize("name, text", [
    ("README.md", "# my notes"), ("config.yaml", "model: {}"), ("summary.json", '{"a": 1}')])
def test_a_file_attnlab_did_not_write_is_refused_without_force(tmp_path, name, text):
    target = tmp_path / name
    target.write_text(text)
    with pytest.raises(OutputRefused, match="--force"):
        check_output_file(target, "json", option="--json")
    check_output_file(target, "json", option="--json", force=True)
    assert target.read_text() == text  # the check itself never writes


def test_a_file_output_is_never_an_input_and_never_inside_a_run(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("# Matched by `attnlab match`\n")
    with pytest.raises(OutputRefused, match="reads"):
        check_output_file(config, "yaml", option="--out", force=True, inputs=[config])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}")
    with pytest.raises(OutputRefused, match="inside an attnlab training run"):
        check_output_file(run / "bench.json", "json", option="--json")
    check_output_file(tmp_path / "new.json", "json", option="--json")


def test_atomic_files_take_the_umask(tmp_path):
    def private(folder):  # as safetensors writes: a temporary file made 0600, renamed
        (folder / "b.txt").write_text("x")
        os.chmod(folder / "b.txt", 0o600)

    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        write_folder(tmp_path / "f", private)
    finally:
        os.umask(old)
    for path in (tmp_path / "a.txt", tmp_path / "f" / "b.txt"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640
