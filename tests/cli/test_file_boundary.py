"""What users hand the command line: plugins, model folders, run folders, report inputs and
text files that are damaged, missing or of another kind. Each case: exit status 2, one
``error:`` line naming the file (and line or byte) and what was expected, no traceback, and
every file as it was (checksums)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.cli.test_errors import assert_user_error, cli
from tests.helpers import tiny_run_config, tree_checksums

WINDOW = "{name: window, window: 8}"  # a core valid at 64 tokens: serve fails at its input


@pytest.fixture(scope="module")
def root(tmp_path_factory, text_corpus):
    """``run`` (a finished tiny train run), ``sea`` (its native SEA distillation), ``hf``
    (``run`` exported) and ``llama`` (a tiny Hugging Face Llama folder)."""
    from attnlab.distill import distill, load_distill_config
    from attnlab.train import load_run_config, train

    root = tmp_path_factory.mktemp("file-boundary")
    train(load_run_config(base=tiny_run_config(text_corpus, root / "cache", steps=4)),
          root / "run", progress=False)
    distill(load_distill_config(base={"distill": {
        "teacher": str(root / "run"), "student_attention": {"name": "sea", "k": 2,
                                                             "predictor_length": 8},
        "steps": 2, "batch_size": 2, "eval_every": 0, "eval_tokens": 256,
        "final_eval_tokens": 256, "ckpt_every": 2, "query_skip": [1], "long_context": 1}}),
        root / "sea", progress=False)
    if _has_transformers():
        from attnlab.bench.hf import save_tiny_llama
        from attnlab.hf import export_run

        export_run(root / "run", root / "hf")
        save_tiny_llama(root / "llama")
    return root


def _has_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


needs_hf = pytest.mark.skipif(not _has_transformers(), reason="needs the hf extra")


@pytest.fixture
def copy_of(root, tmp_path):
    """``copy_of(name)``: a private copy of one of :func:`root`'s folders."""
    import shutil

    def make(name: str) -> Path:
        shutil.copytree(root / name, tmp_path / name)
        return tmp_path / name

    return make


def unchanged(argv, capsys, folder: Path, *words: str) -> None:
    """The command is refused with ``words`` and leaves ``folder`` exactly as it was."""
    before = tree_checksums(folder)
    assert_user_error(argv, capsys, *words)
    assert tree_checksums(folder) == before


# ---------------------------------------------------------------- --plugin

PLUGINS = {
    "syntax": ("x = 1\ndef f(:\n    pass\n", [":2:", "SyntaxError"]),
    "raises": ("x = 1\n\nraise RuntimeError('boom at import')\n",
               [":3:", "RuntimeError: boom at import"]),
    "imports": ("import attnlab_no_such_module_anywhere\n",
                [":1:", "No module named 'attnlab_no_such_module_anywhere'"]),
}


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """The current folder; ``sys.path`` and the plugins' modules are undone afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("boundary_plugin_")]:
        del sys.modules[name]


@pytest.mark.parametrize("case", sorted(PLUGINS))
@pytest.mark.parametrize("by", ["name", "path"])
def test_a_plugin_that_fails_to_import_names_its_file_and_line(case, by, plugin_dir, capsys):
    source, words = PLUGINS[case]
    name = f"boundary_plugin_{case}_{by}"
    file = plugin_dir / f"{name}.py"
    file.write_text(source)
    plugin = name if by == "name" else str(file)
    assert_user_error(["--plugin", plugin, "macs", "--config", "tiny"], capsys,
                      f"--plugin {plugin}", f"{name}.py", *words)


@pytest.mark.parametrize("plugin, words", [
    ("missing.py", ["missing.py does not exist", "path of a .py file"]),
    ("notes.txt", ["notes.txt is not a .py file"]),
    ("a_folder", ["--plugin a_folder: a folder, not a module"]),
    ("./a_folder", ["--plugin ./a_folder: a folder", "a .py file"]),
    ("./sub/missing.py", ["does not exist"]),
    ("no_such_plugin_module", ["cannot import it", "no module no_such_plugin_module"]),
])
def test_a_plugin_that_is_not_a_python_file_or_module(plugin, words, plugin_dir, capsys):
    (plugin_dir / "notes.txt").write_text("x = 1\n")
    (plugin_dir / "a_folder").mkdir()
    assert_user_error(["--plugin", plugin, "macs", "--config", "tiny"], capsys, *words)


@pytest.mark.parametrize("relative", [True, False])
def test_a_plugin_is_imported_from_its_path(relative, plugin_dir, capsys):
    (plugin_dir / "sub").mkdir()
    file = plugin_dir / "sub" / "boundary_plugin_ok.py"
    file.write_text("print('boundary plugin imported')\n")
    plugin = "sub/boundary_plugin_ok.py" if relative else str(file)
    code, err = cli(["--plugin", plugin, "macs", "--config", "tiny"], capsys)
    assert code == 0, err
    assert sys.modules["boundary_plugin_ok"].__file__ == str(file.resolve())


def test_a_plugin_file_may_not_shadow_an_imported_module(plugin_dir, capsys):
    (plugin_dir / "json.py").write_text("x = 1\n")
    assert_user_error(["--plugin", "json.py", "macs", "--config", "tiny"], capsys,
                      "a module named json is already imported", "rename the file")


# ---------------------------------------------------------------- model folders


@needs_hf
@pytest.mark.parametrize("folder", ["hf", "llama"])
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_weights_file_is_named(folder, damage, copy_of, capsys):
    model = copy_of(folder)
    weights = model / "model.safetensors"
    if damage == "truncated":
        with open(weights, "r+b") as fh:
            fh.truncate(weights.stat().st_size // 2)
    else:
        weights.write_bytes(b"not safetensors at all")
    unchanged(["bench", "serve", "--model", model, "--seq-lens", "64", "--core", WINDOW],
              capsys, model, f"{weights} is truncated or corrupt", "download the model again")


@needs_hf
def test_a_missing_gguf_file_lists_the_ones_there(copy_of, capsys):
    model = copy_of("llama")
    (model / "b.gguf").write_bytes(b"GGUF")
    (model / "a.gguf").write_bytes(b"GGUF")
    unchanged(["bench", "serve", "--model", model, "--gguf-file", "x.gguf", "--seq-lens", "64",
               "--core", WINDOW], capsys, model,
              f"the GGUF file x.gguf is not in {model}", "a.gguf, b.gguf")


# ---------------------------------------------------------------- report inputs

REPORT_DAMAGE = {
    "jsonl-line": ("run", "metrics.jsonl", "a", '{"step": 9, "loss":\n',
                   ["metrics.jsonl:3: not valid JSON", "one JSON object per line"]),
    "jsonl-not-object": ("run", "metrics.jsonl", "a", '"step 9"\n',
                         ["metrics.jsonl:3: a string, not a JSON object"]),
    "jsonl-no-step": ("run", "metrics.jsonl", "a", '{"loss": 1.0}\n',
                      ["metrics.jsonl:3: a record without 'step'"]),
    "jsonl-binary": ("run", "metrics.jsonl", "a", b"\xff\xfe\n",
                     ["metrics.jsonl: not UTF-8 text (invalid byte at offset"]),
    "summary": ("run", "summary.json", "w", "{bad", ["summary.json: not valid JSON",
                                                      "line 1, column 2", "a run's summary"]),
    "summary-array": ("run", "summary.json", "w", "[1, 2]", ["summary.json: an array"]),
    "student-summary": ("sea", "summary.json", "w", "{bad", ["summary.json: not valid JSON"]),
}


@pytest.mark.parametrize("case", sorted(REPORT_DAMAGE))
def test_report_names_a_damaged_run_file(case, copy_of, tmp_path, capsys):
    folder_name, name, mode, content, words = REPORT_DAMAGE[case]
    folder = copy_of(folder_name)
    with open(folder / name, mode + ("b" if isinstance(content, bytes) else "")) as fh:
        fh.write(content)
    unchanged(["report", folder, "--out", tmp_path / "report"], capsys, folder,
              str(folder / name), *words)
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("content, words", [
    ('{"machine": ', ["not valid JSON (Expecting value at line 1, column 13)"]),
    (b"\xef\xbb\xbf\xff{}", ["not UTF-8 text (invalid byte at offset 3)"]),
    ('{"machine": {}, "results": [{"bench": "train"}]}',
     ["result 0 is not a bench record", "'pass'"]),
    ('{"machine": {}, "results": 3}', ["no machine and results"]),
    ('{"demo": 3}', ["not a bench JSON file, demo.json or run folder"]),
])
def test_report_names_a_damaged_json_input(content, words, tmp_path, capsys):
    path = tmp_path / "input.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    unchanged(["report", path, "--out", tmp_path / "report"], capsys, path, str(path), *words)
    assert not (tmp_path / "report").exists()


# ---------------------------------------------------------------- run folders


@pytest.mark.parametrize("argv, words", [
    (["train", "--resume", "--out", "{sea}"],
     ["holds a distillation, not a run", "attnlab distill --out {sea} --resume"]),
    (["train", "--config", "tiny", "--out", "{sea}"],
     ["holds a distillation, not a run", "attnlab distill --out {sea} --resume",
      "choose another --out"]),
    (["distill", "--resume", "--out", "{run}"],
     ["holds a run, not a distillation", "attnlab train --out {run} --resume"]),
    (["distill", "--teacher", "{sea}", "--out", "{run}"],
     ["holds a run, not a distillation", "attnlab train --out {run} --resume"]),
])
def test_resuming_with_the_wrong_command_names_the_right_one(argv, words, root, capsys):
    paths = {"sea": root / "sea", "run": root / "run"}
    before = {name: tree_checksums(path) for name, path in paths.items()}
    assert_user_error([a.format(**paths) for a in [*argv, "--quiet"]], capsys,
                      *(w.format(**paths) for w in words))
    assert {name: tree_checksums(path) for name, path in paths.items()} == before


@needs_hf
def test_export_of_an_unfinished_distillation_says_to_resume_it_with_distill(copy_of, tmp_path,
                                                                             capsys):
    sea = copy_of("sea")
    (sea / "summary.json").unlink()
    unchanged(["export", "--run", sea, "--out", tmp_path / "hf"], capsys, sea,
              f"finish it with attnlab distill --out {sea} --resume")


@pytest.mark.parametrize("name, content, words", [
    ("summary.json", "{bad", ["summary.json: not valid JSON", "remove it and run attnlab train "
                                                              "--out"]),
    ("metrics.jsonl", "{bad\n", ["metrics.jsonl:3: not valid JSON", "fix or remove that line"]),
    ("config_changes.jsonl", '{"step": 1}\n',
     ["config_changes.jsonl:1: a record without 'changes'"]),
])
def test_resume_names_a_damaged_run_file(name, content, words, copy_of, capsys):
    run = copy_of("run")
    with open(run / name, "a" if name == "metrics.jsonl" else "w") as fh:
        fh.write(content)
    argv = ["train", "--resume", "--out", run, "--quiet"]
    if name != "summary.json":  # a run that has steps to go, so it reads its logs
        argv += ["--set", "train.steps=6"]
    unchanged(argv, capsys, run, str(run / name), *words)


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe", ["meta.json: not UTF-8 text (invalid byte at offset 0)"]),
    (b"[1]", ["meta.json: an array, not a JSON object"]),
    (b'{"format": 1}', ["meta.json is corrupt: it holds no integer step"]),
])
def test_a_damaged_checkpoint_meta_is_named(content, words, copy_of, capsys):
    run = copy_of("run")
    (meta := next((run / "checkpoints").glob("step-*")) / "meta.json").write_bytes(content)
    unchanged(["eval", "--run", run], capsys, run, *words, "older checkpoint")
    assert meta.read_bytes() == content


def test_a_config_that_is_not_yaml_is_one_line(copy_of, capsys):
    run = copy_of("run")
    (run / "config.yaml").write_text("model: [\n  d_model: 32\n")
    status, err = cli(["eval", "--run", run], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{run / 'config.yaml'}: not valid YAML" in err and "at line" in err


def test_an_interrupted_demo_says_to_run_the_demo_again(tmp_path, monkeypatch, capsys):
    from attnlab.train import RunInterrupted

    def interrupted(out, **options):
        raise RunInterrupted(signal.SIGINT, 3, Path(out) / "runs" / "dense-h8")

    monkeypatch.setattr("attnlab.demo.run_demo", interrupted)
    status, err = cli(["demo", "--smoke", "--out", tmp_path / "demo", "--quiet"], capsys)
    assert status == 130, err
    assert f"continue with: attnlab demo --out {tmp_path / 'demo'} with the same options" in err
    assert "--resume" not in err


# ---------------------------------------------------------------- visualize


def test_visualize_refuses_text_that_is_not_utf8(root, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_bytes("déf visualize():\n".encode() + b"\xff\n")
    unchanged(["visualize", root / "sea", "--text-file", text, "--out", tmp_path / "out"],
              capsys, text, f"{text}: not UTF-8 text (invalid byte at offset 18)")
    assert not (tmp_path / "out").exists()


def test_visualize_refuses_an_explicit_teacher_it_cannot_use(root, tmp_path, capsys):
    for teacher in (tmp_path / "missing", tmp_path):
        assert_user_error(["visualize", root / "sea", "--text", "hello world", "--teacher",
                           teacher, "--out", tmp_path / "out"], capsys,
                          f"teacher {teacher}: not an attnlab run folder")
    assert not (tmp_path / "out").exists()


def test_visualize_names_a_damaged_distill_yaml(copy_of, tmp_path, capsys):
    sea = copy_of("sea")
    (sea / "distill.yaml").write_text("distill: {teacher: [\n")
    unchanged(["visualize", sea, "--text", "hello world", "--out", tmp_path / "out"], capsys,
              sea, f"{sea / 'distill.yaml'}: not valid YAML")
    (sea / "distill.yaml").write_text("distill: {teacher: 3}\n")
    unchanged(["visualize", sea, "--text", "hello world", "--out", tmp_path / "out"], capsys,
              sea, "distill.teacher is 3")

