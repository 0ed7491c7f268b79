"""The write policy at the command line: no command writes over what it did not make.

Every writing command is driven at destinations it must refuse (a run, another command's
output, a folder holding its input, its input itself, a file attnlab did not write): exit 2,
one ``error:`` line, no traceback, and every file there as it was (checksums). Then what it
may do: write a new destination, rewrite its own output, and with ``--force`` write beside
other files while replacing none of them."""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from attnlab.utils.outputs import OWNER_FILE
from tests.cli.test_errors import assert_user_error, cli
from tests.helpers import dump_config, tree_checksums
from tests.helpers import tiny_run_config as run_config_dict


@pytest.fixture(scope="module")
def runs(tmp_path_factory, text_corpus):
    """``ROOT/runs/a`` and ``ROOT/runs/b``: two finished tiny runs."""
    from attnlab.train import load_run_config, train

    root = tmp_path_factory.mktemp("write-policy")
    cfg = run_config_dict(text_corpus, root / "cache", steps=2)
    for name in ("a", "b"):
        train(load_run_config(base=cfg), root / "runs" / name, progress=False)
    return root


@pytest.fixture
def work(runs, tmp_path, monkeypatch):
    """A private copy of the runs, the current folder, and a checksum of everything."""
    shutil.copytree(runs / "runs", tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(argv, capsys, root, *words):
    """The command is refused with ``words`` and leaves every file under ``root`` as it was
    (nothing added, nothing changed)."""
    before = tree_checksums(root)
    assert_user_error(argv, capsys, *words)
    assert tree_checksums(root) == before


@pytest.mark.parametrize("out, words", [
    ("runs/a", ["the folder this command reads"]),
    ("runs", ["holds", "which this command reads", "--force"]),
    (".", ["holds", "which this command reads"]),
    ("runs/b", ["already holds an attnlab training run", "--force"]),
])
def test_export_refuses_runs_inputs_and_their_parents(work, capsys, out, words):
    refused(["export", "--run", "runs/a", "--out", out], capsys, work, *words)


def test_export_rewrites_its_own_folder_and_writes_beside_others_only_with_force(
        work, capsys):
    assert cli(["export", "--run", "runs/a", "--out", "hf"], capsys)[0] == 0
    assert (work / "hf" / OWNER_FILE).is_file()
    assert cli(["export", "--run", "runs/b", "--out", "hf"], capsys)[0] == 0  # its own
    (work / "mine").mkdir()
    (work / "mine" / "notes.txt").write_text("keep me")
    refused(["export", "--run", "runs/a", "--out", "mine"], capsys, work, "1 entry")
    assert cli(["export", "--run", "runs/a", "--out", "mine", "--force"], capsys)[0] == 0
    assert (work / "mine" / "notes.txt").read_text() == "keep me"
    assert (work / "mine" / "model.safetensors").is_file()
    # forced into the runs' parent: written beside them, both runs untouched
    before = tree_checksums(work / "runs")
    assert cli(["export", "--run", "runs/a", "--out", "runs", "--force"], capsys)[0] == 0
    assert tree_checksums(work / "runs") == {**before, **{
        k: v for k, v in tree_checksums(work / "runs").items() if "/" not in k}}


def test_export_into_the_current_empty_folder(work, capsys, monkeypatch):
    (work / "here").mkdir()
    monkeypatch.chdir(work / "here")
    assert cli(["export", "--run", "../runs/a", "--out", "."], capsys)[0] == 0
    assert (work / "here" / "model.safetensors").is_file()
    assert not [p for p in work.iterdir() if p.name.startswith(".tmp")]


def test_exported_files_are_readable_by_others_under_the_usual_umask(work, capsys):
    old = os.umask(0o022)
    try:
        assert cli(["export", "--run", "runs/a", "--out", "hf"], capsys)[0] == 0
    finally:
        os.umask(old)
    for path in (work / "hf").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_match_never_writes_over_its_config_nor_a_file_it_did_not_write(work, capsys):
    config = dump_config({"model": {"d_model": 64, "n_layers": 2, "d_ff": 128,
                                    "attention": {"n_heads": 4}}}, work / "dense.yaml")
    args = ["match", "--config", config, "--heads", "2", "--experts", "4"]
    refused([*args, "--out", config], capsys, work, "a file this command reads")
    refused([*args, "--out", config, "--force"], capsys, work, "a file this command reads")
    (work / "notes.yaml").write_text("mine: 1\n")
    refused([*args, "--out", "notes.yaml"], capsys, work, "did not write", "--force")
    refused([*args, "--json", "runs/a/summary.json"], capsys, work, "inside an attnlab "
            "training run")
    assert cli([*args, "--out", "sh.yaml", "--json", "sh.json"], capsys)[0] == 0
    assert cli([*args, "--out", "sh.yaml", "--json", "sh.json"], capsys)[0] == 0  # its own
    assert cli([*args, "--out", "notes.yaml", "--force"], capsys)[0] == 0


@pytest.mark.parametrize("out, words", [
    ("runs/a", ["the folder this command reads"]),
    ("runs/b", ["already holds an attnlab training run"]),
])
def test_report_refuses_runs_and_inputs(work, capsys, out, words):
    refused(["report", "runs/a", "--out", out], capsys, work, *words)


def test_report_rewrites_its_own_folder_but_not_another_commands(work, capsys):
    assert cli(["report", "runs/a", "--out", "rep"], capsys)[0] == 0
    assert cli(["report", "runs/a", "runs/b", "--out", "rep"], capsys)[0] == 0
    assert cli(["export", "--run", "runs/a", "--out", "hf"], capsys)[0] == 0
    refused(["report", "runs/a", "--out", "hf"], capsys, work, "exported attnlab model")


def test_visualize_refuses_its_model_folder(work, capsys):
    refused(["visualize", "runs/a", "--text", "hello", "--out", "runs/a"], capsys, work,
            "the folder this command reads")
    refused(["visualize", "runs/a", "--text", "hello", "--out", "runs/b"], capsys, work,
            "already holds an attnlab training run")


def test_demo_refuses_a_training_run(work, capsys):
    refused(["demo", "--smoke", "--out", "runs/a", "--quiet"], capsys, work,
            "already holds an attnlab training run")


@pytest.mark.parametrize("command", ["train", "distill"])
def test_a_new_run_needs_an_empty_folder_unless_forced(work, capsys, command,
                                                       tiny_run_config):
    (work / "notes").mkdir()
    (work / "notes" / "todo.txt").write_text("keep me")
    argv = ([command, "--config", dump_config(tiny_run_config(steps=1), work / "c.yaml")]
            if command == "train" else [command, "--teacher", "runs/a"])
    refused([*argv, "--out", "notes", "--quiet"], capsys, work, "1 entry attnlab did not "
            "write", "--force")
    refused([*argv, "--out", "runs", "--quiet"], capsys, work, "--force")


def test_train_with_force_starts_beside_other_files(work, capsys, tiny_run_config):
    (work / "notes").mkdir()
    (work / "notes" / "todo.txt").write_text("keep me")
    config = dump_config(tiny_run_config(steps=1, ckpt_every=1), work / "c.yaml")
    code, err = cli(["train", "--config", config, "--out", "notes", "--quiet", "--force"],
                    capsys)
    assert code == 0, err
    assert (work / "notes" / "todo.txt").read_text() == "keep me"
    assert (work / "notes" / "summary.json").is_file()


@pytest.mark.parametrize("argv", [
    ["bench", "attention", "--mechanisms", "sdpa", "--seq-lens", "16", "--reps", "5"],
    ["bench", "layer", "--preset", "tiny"],
    ["long-context", "--model", "runs/a", "--tasks", "perplexity", "--lengths", "64"],
])
@pytest.mark.parametrize("option, name, content", [
    ("--json", "README.md", "# my notes\n"),
    ("--json", "results.json", '{"steps": 3}'),
])
def test_bench_outputs_refuse_files_attnlab_did_not_write(work, capsys, argv, option, name,
                                                          content):
    (work / name).write_text(content)
    refused([*argv, option, name], capsys, work, "did not write it", "--force")


def test_bench_plot_refuses_a_picture_attnlab_did_not_write(work, capsys):
    (work / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    refused(["bench", "attention", "--mechanisms", "sdpa", "--seq-lens", "16", "--plot",
             "photo.png"], capsys, work, "did not write it")


def test_two_outputs_of_one_command_may_not_be_one_file(work, capsys):
    refused(["bench", "attention", "--mechanisms", "sdpa", "--seq-lens", "16", "--json",
             "same", "--plot", "same"], capsys, work, "--json and --plot", "same file")
