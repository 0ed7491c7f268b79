"""attnlab visualize on Hugging Face students: a converted Llama (grouped-query) against its
teacher, a bidirectional BERT with batch top-k, and a distillation folder."""

from __future__ import annotations

import pytest
import torch

import attnlab.hf
from attnlab.bench.hf import tiny_tokenizer
from attnlab.distill import distill, load_distill_config
from attnlab.distill.record import LayerRecorder
from attnlab.visualize import open_subject, visualize
from attnlab.visualize.sea import sea_maps
from tests.hf.models import save_model
from tests.visualize.test_visualize import TEXT, assert_picture


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _student(family, folder, tokenizer, **options):
    """A converted copy of a saved tiny ``family`` model (its teacher), saved beside it."""
    teacher = save_model(family, folder / "teacher", tokenizer)
    student = attnlab.hf.convert(attnlab.hf.load(teacher), "sea",
                                 {"k": 2, "predictor_length": 8, **options})
    student.save_pretrained(folder / "student")
    tokenizer.save_pretrained(folder / "student")
    return teacher, folder / "student"


def test_llama_student_against_its_teacher(tmp_path, tokenizer):
    teacher, student = _student("llama", tmp_path, tokenizer)
    summary = visualize(student, TEXT, tmp_path / "out", layer=1, head=None, teacher=str(teacher),
                        max_tokens=30)
    assert summary["sea"]["reference"] == "teacher's attention"
    assert len(summary["sea"]["heads"]) == 4  # 4 query heads over 2 key-value heads
    assert_picture(tmp_path / "out" / "sea-attention.png")
    subject = open_subject(student, TEXT, teacher=str(teacher), max_tokens=30)
    m = sea_maps(subject, [1])[0]
    recorder = LayerRecorder(attnlab.hf.cores(subject.teacher), probs=True)
    with torch.no_grad(), recorder.recording() as recorded:
        subject.teacher(input_ids=subject.ids)
    torch.testing.assert_close(m.reference, recorded.probs[1][0])
    assert not m.performer.triu(1).any() and not m.attended.triu(1).any()


def test_bidirectional_student_with_batch_top_k(tmp_path, tokenizer):
    teacher, student = _student("bert", tmp_path, tokenizer, topk_group="batch")
    summary = visualize(student, TEXT, tmp_path / "out", head=0, teacher=str(teacher),
                        max_tokens=30)
    m = sea_maps(open_subject(student, TEXT, teacher=str(teacher), max_tokens=30), [0])[0]
    assert m.visible.all()  # every query sees every key
    torch.testing.assert_close(m.estimate.sum(-1), torch.ones(4, m.estimate.shape[-1]))
    assert m.attended.triu(1).any()  # keys after the query are attended too
    assert 0 < summary["sea"]["heads"][0]["attended_fraction"] < 1
    assert_picture(tmp_path / "out" / "sea-attention.png")


def test_a_distillation_folder_brings_its_student_and_teacher(tmp_path, tokenizer, text_corpus):
    teacher = save_model("llama", tmp_path / "teacher", tokenizer)
    cfg = load_distill_config(base={
        "distill": {"teacher": str(teacher), "student_attention": {"name": "sea", "k": 2,
                                                                   "predictor_length": 8},
                    "steps": 1, "batch_size": 2, "seq_len": 16, "eval_every": 0,
                    "eval_tokens": 64, "final_eval_tokens": 64, "ckpt_every": 1,
                    "query_skip": [1], "long_context": 1},
        "data": {"corpus": "text", "path": str(text_corpus), "cache_dir": str(tmp_path / "c")}})
    distill(cfg, tmp_path / "run", progress=False)
    summary = visualize(tmp_path / "run", TEXT, tmp_path / "out", head=0, max_tokens=16)
    assert summary["sea"]["reference"] == "teacher's attention"
    assert (tmp_path / "out" / "sea-attention.png").is_file()
