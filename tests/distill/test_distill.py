"""attnlab distill from attnlab teachers: the loop, the student, the targets, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.config import ConfigError, PartSpec
from attnlab.distill import StudentMismatch, distill, load_distill_config
from attnlab.distill.record import LayerRecorder, attention_targets, model_cores
from attnlab.distill.student import extend_context, init_student, student_config
from attnlab.layers import CORES
from attnlab.train import load_run_config, train
from attnlab.train.run import load_run

SEA = {"name": "sea", "k": 4, "predictor_length": 8}


@pytest.fixture
def teacher(tiny_run_config, tmp_path):
    out = tmp_path / "teacher"
    train(load_run_config(base=tiny_run_config(steps=10, eval_every=0, final_eval_tokens=1024)),
          out, progress=False)
    return out


def _cfg(teacher, **distill):
    base = {"steps": 4, "batch_size": 2, "eval_every": 2, "eval_tokens": 512,
            "final_eval_tokens": 1024, "ckpt_every": 2, "log_every": 2, "query_skip": [1, 2],
            "teacher": str(teacher), "student_attention": SEA, **distill}
    return load_distill_config(base={"distill": base})


def test_distill_writes_a_student_run_with_teacher_and_student_perplexity(teacher, tmp_path):
    out = tmp_path / "student"
    summary = distill(_cfg(teacher), out, progress=False)
    assert summary["steps"] == 4 and summary["seq_len"] == 32
    for key in ("teacher_ppl", "student_ppl", "ppl_ratio", "teacher_bpc", "student_bpc"):
        assert summary[key] > 0, key
    grid = {(r["k"], r["query_skip"]) for r in summary["inference"]}
    assert grid == {(k, s) for k in (2, 4, 8) for s in (1, 2)}
    teacher = summary["inference_teacher"]  # Table A.6's costs, measured side by side
    assert teacher["seq_len"] == 32 and teacher["reps"] == 5
    assert teacher["latency_ms"] > 0 and teacher["peak_mb"] > 0
    for cell in summary["inference"]:
        assert cell["latency_x_teacher"] == pytest.approx(cell["latency_ms"]
                                                          / teacher["latency_ms"])
        assert cell["peak_mb"] > 0 and cell["peak_x_teacher"] > 0
    assert summary["long_context"]["seq_len"] == 64
    assert json.loads((out / "summary.json").read_text()) == summary
    run = load_run(out)  # the student folder is an ordinary attnlab run
    assert run.cfg.model.attention.core.name == "sea" and run.step == 4
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r for r in records if "loss" in r]
    assert {"ce", "kl", "hidden", "context", "sea_estimate", "sea_attention"} <= set(losses[0])


def test_distill_resumes_and_extends(teacher, tmp_path):
    out = tmp_path / "student"
    distill(_cfg(teacher, steps=2, long_context=1), out, progress=False)
    summary = distill(_cfg(teacher, steps=4, long_context=1), out, resume=True, progress=False)
    assert summary["steps"] == 4 and "long_context" not in summary


def test_performer_student_trains_without_sea_terms(teacher, tmp_path):
    summary = distill(_cfg(teacher, student_attention="performer", long_context=1),
                      tmp_path / "performer", progress=False)
    assert summary["inference"] == [] and summary["student_ppl"] > 0


def test_student_holds_every_teacher_weight_and_only_adds_core_parameters(teacher):
    run = load_run(teacher)
    student, new = init_student(run.model, student_config(run.cfg, PartSpec.parse(SEA, "x")))
    t_state, s_state = run.model.state_dict(), student.state_dict()
    assert all(torch.equal(t_state[k], s_state[k]) for k in t_state)
    assert new and all(".attn.core.estimator." in name for name in new)


def test_teacher_targets_reach_the_sea_cores_and_train_the_projections(teacher):
    run = load_run(teacher)
    student, _ = init_student(run.model, student_config(run.cfg, PartSpec.parse(SEA, "x")))
    student.train()
    recorder = LayerRecorder.of_model(run.model, probs=True)
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad(), recorder.recording() as recorded:
        run.model(x)
    recorder.close()
    assert [p.shape for p in recorded.probs] == [(2, 2, 16, 16)] * 2
    torch.testing.assert_close(recorded.probs[0].sum(-1), torch.ones(2, 2, 16))
    with attention_targets(model_cores(student), recorded.probs):
        out = student(x)
    assert all(b.attn.core.teacher_probs is None for b in student.blocks)  # cleared after
    out.aux["sea_attention"].backward()
    q_weight = student.blocks[0].attn.projections.q_proj.weight
    assert q_weight.grad is not None and q_weight.grad.abs().sum() > 0


def test_extended_context_interpolates_positions(teacher):
    run = load_run(teacher)
    student, _ = init_student(run.model, student_config(run.cfg, PartSpec.parse(SEA, "x")))
    longer = extend_context(student, 2)
    assert longer.cfg.max_seq_len == 2 * student.cfg.max_seq_len
    assert longer.cfg.attention.positions.options["interpolation"] == 2
    table = student.blocks[0].attn.core.estimator.position_table
    torch.testing.assert_close(longer.blocks[0].attn.core.estimator.position_table[1::2], table)
    rope, long_rope = student.blocks[0].attn.positions, longer.blocks[0].attn.positions
    torch.testing.assert_close(long_rope.inv_freq, rope.inv_freq / 2)
    assert longer(torch.randint(0, 256, (1, 128))).logits.shape == (1, 128, 256)


def test_bad_teachers_and_students_are_rejected(teacher, tmp_path, tiny_run_config):
    with pytest.raises(ConfigError, match="not an attnlab run folder"):
        distill(_cfg(tmp_path / "missing"), tmp_path / "a", progress=False)
    with pytest.raises(ConfigError, match="unknown"):
        distill(_cfg(teacher, student_attention="flash"), tmp_path / "b", progress=False)
    run = load_run(teacher)
    xl = load_run_config(base=tiny_run_config())
    xl.model.attention.positions = PartSpec("xl")
    with pytest.raises(ConfigError, match="score bias"):
        student_config(xl, PartSpec("performer"))
    other = student_config(run.cfg, PartSpec("sea"))
    other.model.d_ff = 96
    with pytest.raises(StudentMismatch, match="do not fit"):
        init_student(run.model, other)
    with pytest.raises(ConfigError, match="steps must be >= 1"):
        _cfg(teacher, steps=0)
    with pytest.raises(ConfigError, match="grid_reps must be 0 .no timing. or >= 5"):
        _cfg(teacher, grid_reps=2)


def test_cli_distill(teacher, tmp_path, capsys):
    from attnlab.cli import main

    out = tmp_path / "cli"
    code = main(["distill", "--teacher", str(teacher), "--student-attention",
                 "{name: sea, k: 4, predictor_length: 8}", "--set", "steps=2",
                 "--set", "final_eval_tokens=512", "--set", "long_context=1",
                 "--set", "query_skip=[1]", "--out", str(out), "--quiet"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    assert main(["distill", "--teacher", str(tmp_path / "nope"), "--out",
                 str(tmp_path / "x"), "--quiet"]) == 2


STUDENT_OPTIONS = {"sea": SEA, "reformer": {"name": "reformer", "bucket_size": 8},
                   "window": {"name": "window", "sinks": 1, "window": 8},
                   "oracle": {"name": "oracle", "k": 4},
                   "quest": {"name": "quest", "budget": 8, "page": 2},
                   "block": {"name": "block", "budget": 8, "page": 2},
                   "sea_pages": {"name": "sea_pages", "budget": 8, "page": 2}}


@pytest.mark.parametrize("core", CORES.names())
def test_every_student_core_distils_and_writes_a_summary(teacher, tmp_path, core):
    """With the default settings (the long-context evaluation at twice the length included),
    a student of every registered core trains, evaluates and writes its summary."""
    summary = distill(_cfg(teacher, steps=2, student_attention=STUDENT_OPTIONS.get(core, core)),
                      tmp_path / core, progress=False)
    assert json.loads((tmp_path / core / "summary.json").read_text()) == summary
    assert summary["student_ppl"] > 0
    long = summary["long_context"]
    assert long["seq_len"] == 64 and ("skipped" in long or long["student_ppl"] > 0)


@pytest.mark.parametrize("student", ["performer", "reformer"])
def test_the_sea_paper_recipe_distils_the_baselines(teacher, tmp_path, student):
    out = tmp_path / student
    summary = distill(_cfg(teacher, steps=2, recipe="sea-paper", student_attention=student),
                      out, progress=False)
    assert summary["student_ppl"] > 0
    saved = load_distill_config(out / "distill.yaml").distill
    assert (saved.recipe, saved.lr, saved.pretrained_lr_mult, saved.context_weight) == (
        "sea-paper", 1e-5, 1.0, 0.0)
