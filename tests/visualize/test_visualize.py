"""attnlab visualize: SEA's maps and SwitchHead's expert choices, from attnlab runs and
Hugging Face students; the PNGs are read back and must hold a real picture."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.distill import distill, load_distill_config
from attnlab.distill.record import LayerRecorder
from attnlab.layers.cores import DenseCore, ScoreOptions
from attnlab.ops.attention import softmax_attention
from attnlab.train import load_run_config, train
from attnlab.train.run import load_run
from attnlab.visualize import open_subject, visualize
from attnlab.visualize.sea import sea_maps
from attnlab.visualize.switchhead import expert_choices
from tests.helpers import tiny_run_config

TEXT = ("def visualize(path, text):\n    \"\"\"Draw what the attention of a model does on a "
        "text, layer by layer and head by head.\"\"\"\n    return path, text\n")
SEA = {"name": "sea", "k": 2, "predictor_length": 8}


def assert_picture(path, min_size=(300, 300)):
    """A PNG with a real picture: its size, and many distinct colours (not a blank canvas)."""
    from matplotlib import image

    pixels = image.imread(path)
    assert pixels.shape[0] >= min_size[0] and pixels.shape[1] >= min_size[1]
    colours = {tuple(p) for p in pixels[::3, ::3, :3].reshape(-1, 3).round(2).tolist()}
    assert len(colours) > 50, f"{path}: {len(colours)} colours"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, text_corpus):
    """A dense teacher, its SEA student (distilled a few steps) and a SwitchHead model."""
    root = tmp_path_factory.mktemp("runs")
    base = tiny_run_config(text_corpus, root / "cache", steps=6, batch_size=4)
    train(load_run_config(base=base), root / "teacher", progress=False)
    distill(load_distill_config(base={"distill": {
        "teacher": str(root / "teacher"), "student_attention": SEA, "steps": 2, "batch_size": 2,
        "eval_every": 0, "eval_tokens": 256, "final_eval_tokens": 256, "ckpt_every": 2,
        "query_skip": [1], "long_context": 1}}), root / "sea", progress=False)
    switch = {**base, "model": {**base["model"], "attention": {
        "n_heads": 2, "projections": {"name": "switchhead", "n_experts": 4, "k": 2}}}}
    train(load_run_config(base=switch), root / "switchhead", progress=False)
    return root


def test_sea_student_maps_against_its_teacher(runs, tmp_path):
    summary = visualize(runs / "sea", TEXT, tmp_path, layer=None, head=None, max_tokens=40)
    assert_picture(tmp_path / "sea-attention.png", (1000, 1000))
    saved = json.loads((tmp_path / "visualize.json").read_text())
    assert saved == summary and saved["tokens"] == 40
    assert saved["sea"]["reference"] == "teacher's attention"
    assert [(r["layer"], r["head"]) for r in saved["sea"]["heads"]] == [(0, 0), (0, 1), (1, 0),
                                                                        (1, 1)]
    for row in saved["sea"]["heads"]:
        assert 0 < row["attended_fraction"] < 1 and 0 < row["reference_weight_attended"] <= 1
    # the reference is the teacher's attention on the same tokens
    subject = open_subject(runs / "sea", TEXT, max_tokens=40)
    maps = sea_maps(subject, [1])
    teacher = load_run(runs / "teacher").model
    recorder = LayerRecorder.of_model(teacher, probs=True)
    with torch.no_grad(), recorder.recording() as recorded:
        teacher(subject.ids)
    torch.testing.assert_close(maps[0].reference, recorded.probs[1][0])
    m = maps[0]
    assert m.reference.shape == m.performer.shape == m.estimate.shape == (2, 40, 40)
    for weights in (m.reference, m.performer, m.estimate):  # causal rows of weights
        assert not weights.triu(1).any()
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 40))
    assert not m.attended.triu(1).any() and m.attended.diagonal(dim1=-2, dim2=-1).any()


def test_without_its_teacher_the_reference_is_the_models_own_attention(runs, tmp_path):
    student = tmp_path / "student"
    shutil.copytree(runs / "sea", student)
    (student / "distill.yaml").unlink()  # a SEA model with no known teacher
    summary = visualize(student, TEXT, tmp_path / "out", layer=-1, head=1, max_tokens=24)
    assert summary["sea"]["reference"].startswith("exact attention")
    assert [(r["layer"], r["head"]) for r in summary["sea"]["heads"]] == [(1, 1)]
    subject = open_subject(student, TEXT, max_tokens=24)
    m = sea_maps(subject, [1])[0]
    dense = copy.deepcopy(subject.model)  # layer 1 exact: the same inputs, exact attention
    last = dense.blocks[1].attn
    last.core = DenseCore(last.ctx, ScoreOptions(), 0.0, softmax_attention)
    recorder = LayerRecorder([last.core], probs=True)
    with torch.no_grad(), recorder.recording() as recorded:
        dense(subject.ids)
    torch.testing.assert_close(m.reference, recorded.probs[0][0])
    assert_picture(tmp_path / "out" / "sea-attention.png")


def test_switchhead_expert_choices_and_load(runs, tmp_path):
    summary = visualize(runs / "switchhead", TEXT, tmp_path, layer=1, max_tokens=48)
    assert "sea" not in summary
    assert_picture(tmp_path / "switchhead-experts.png")
    rows = summary["switchhead"]["heads"]
    assert [(r["layer"], r["head"]) for r in rows] == [(1, 0), (1, 1)]
    for row in rows:
        for role in ("v", "o"):
            assert len(row["load"][role]) == 4
            assert sum(row["load"][role]) == pytest.approx(2.0)  # k experts per token
    choices = expert_choices(open_subject(runs / "switchhead", TEXT, max_tokens=48), [1])[0]
    gates = choices.gates["o"]
    assert gates.shape == (2, 48, 4)
    assert ((gates > 0).sum(-1) == 2).all() and (gates <= 1).all()


def test_cli_visualize_and_its_errors(runs, tmp_path, capsys):
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    out = tmp_path / "cli"
    assert main(["visualize", str(runs / "sea"), "--text-file", str(text_file), "--layer", "1",
                 "--head", "0", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "sea-attention.png" in printed and "layer 1 head 0: attended" in printed
    # the default 96 tokens are cut to what the model reads (max_seq_len 64)
    assert json.loads((out / "visualize.json").read_text())["tokens"] == 64
    bad = [
        (["--layer", "7"], "--layer 7: the model's layers that can be shown are [0, 1]"),
        (["--head", "5"], "--head 5"),
        (["--max-tokens", "5000"], "--max-tokens must be in [1, 1024]"),
        (["--text", "   "], "the text is empty"),
    ]
    for extra, message in bad:
        args = ["visualize", str(runs / "sea"), "--out", str(tmp_path / "never")]
        if "--text" not in extra:
            args += ["--text", TEXT]
        assert main(args + extra) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
    assert main(["visualize", str(runs / "teacher"), "--text", TEXT, "--out",
                 str(tmp_path / "never")]) == 2
    assert "nothing to draw" in capsys.readouterr().err
    assert main(["visualize", str(tmp_path), "--text", TEXT, "--out",
                 str(tmp_path / "never")]) == 2
    assert "not an attnlab run folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # the text is required
        main(["visualize", str(runs / "sea"), "--out", str(tmp_path / "never")])
    assert exit_info.value.code == 2


def test_too_many_rows_for_one_figure_is_refused(runs, tmp_path, monkeypatch):
    monkeypatch.setattr("attnlab.visualize.MAX_PANEL_ROWS", 3)
    with pytest.raises(ConfigError, match="2 layers x 2 heads = 4 rows; at most 3"):
        visualize(runs / "sea", TEXT, tmp_path, layer=None, head=None)
    assert not (tmp_path / "visualize.json").exists()
