"""attnlab.hf given what it cannot use: damaged weights, index and tokenizer files (the file
named, and how to get a good one), a GGUF file that is not there, and arguments of the wrong
type (a ``TypeError`` naming the argument, its type and what was given)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import transformers

import attnlab.hf
from attnlab.bench.hf import save_tiny_llama
from tests.helpers import tree_checksums
from tests.hf.models import make_model


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("llama") / "llama")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """An attnlab model folder (``model_type: attnlab``), as ``attnlab export`` writes."""
    from attnlab.config import from_dict
    from attnlab.models import DecoderLM, ModelConfig

    cfg = from_dict(ModelConfig, {"vocab_size": 64, "d_model": 32, "n_layers": 1, "d_ff": 48,
                                  "max_seq_len": 64, "attention": {"n_heads": 2}}, "model")
    folder = tmp_path_factory.mktemp("exported") / "model"
    attnlab.hf.from_decoder(DecoderLM(cfg)).save_pretrained(folder)
    return folder


def truncated_copy(folder: Path, tmp_path: Path, name: str = "model.safetensors") -> Path:
    """A copy of ``folder`` whose file ``name`` lost its second half."""
    import shutil

    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    with open(copy / name, "r+b") as fh:
        fh.truncate(os.path.getsize(copy / name) // 2)
    return copy


@pytest.mark.parametrize("which", ["llama", "exported"])
def test_a_truncated_weights_file_is_named_by_load(which, request, tmp_path):
    folder = truncated_copy(request.getfixturevalue(which), tmp_path)
    before = tree_checksums(folder)
    with pytest.raises(ValueError, match=f"{folder / 'model.safetensors'} is truncated or "
                                         "corrupt .*download the model again"):
        attnlab.hf.load(folder)
    assert tree_checksums(folder) == before


def test_auto_model_names_a_truncated_attnlab_weights_file(exported, tmp_path):
    """attnlab's registered class names the file for ``AutoModel*`` too."""
    folder = truncated_copy(exported, tmp_path)
    for auto in (transformers.AutoModel, transformers.AutoModelForCausalLM):
        with pytest.raises(ValueError, match=f"{folder / 'model.safetensors'} is truncated"):
            auto.from_pretrained(folder)


def test_a_damaged_shard_or_index_is_named(llama, tmp_path):
    sharded = tmp_path / "sharded"
    attnlab.hf.convert(attnlab.hf.load(llama), "sea", {"k": 4, "predictor_length": 8}
                       ).save_pretrained(sharded, max_shard_size="200KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    attnlab.hf.load(sharded)  # the good folder loads
    last = truncated_copy(sharded, tmp_path / "a", shards[-1].name)
    with pytest.raises(ValueError, match=f"{last / shards[-1].name} is truncated or corrupt"):
        attnlab.hf.load(last)
    index = truncated_copy(sharded, tmp_path / "b", "model.safetensors.index.json")
    with pytest.raises(ValueError, match="model.safetensors.index.json: not valid JSON .*"
                                         "expected a sharded checkpoint's index"):
        attnlab.hf.load(index)
    (index / "model.safetensors.index.json").write_text('{"weight_map": [1]}')
    with pytest.raises(ValueError, match="no weight_map of file names"):
        attnlab.hf.load(index)


def test_a_missing_gguf_file_lists_the_ones_there(llama, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"the GGUF file m.gguf is not in {llama}; the "
                                                ".gguf files there: none"):
        attnlab.hf.load(llama, gguf_file="m.gguf")
    (tmp_path / "q4.gguf").write_bytes(b"GGUF")
    with pytest.raises(FileNotFoundError, match="the .gguf files there: q4.gguf"):
        attnlab.hf.check_model_folder(tmp_path, "Q4.gguf")


@pytest.mark.parametrize("content, words", [
    ("{bad", "tokenizer.json: not valid JSON .*copy or download the model again"),
    (b"\xff", "tokenizer.json: not UTF-8 text .*offset 0"),
    ("{}", "transformers cannot build the model's tokenizer .*KeyError"),
])
def test_a_damaged_tokenizer_file_is_named(content, words, llama, tmp_path):
    import shutil

    folder = tmp_path / "llama"
    shutil.copytree(llama, folder)
    file = folder / "tokenizer.json"
    file.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=words):
        attnlab.hf.load_tokenizer(folder)
    assert attnlab.hf.load_tokenizer(llama).vocab_size > 0


MODEL = "must be a transformers.PreTrainedModel"


@pytest.mark.parametrize("call, words", [
    (lambda m: attnlab.hf.convert("gpt2"), f"model {MODEL} .*got str 'gpt2'"),
    (lambda m: attnlab.hf.convert(torch.nn.Linear(2, 2)),
     "model .*got torch.nn.modules.linear.Linear"),
    (lambda m: attnlab.hf.convert(m, 3), "core must be a str .*got int 3"),
    (lambda m: attnlab.hf.convert(m, "sea", "k=4"), "options must be a mapping .*got str"),
    (lambda m: attnlab.hf.convert(m, "sdpa", max_seq_len=True), "max_seq_len must be an int"),
    (lambda m: attnlab.hf.convert(m, "sdpa", max_seq_len=64.0), "got float 64.0"),
    (lambda m: attnlab.hf.load(3), "path must be a str or os.PathLike .*got int 3"),
    (lambda m: attnlab.hf.load("x", dtype="bfloat16"), "dtype must be a torch.dtype"),
    (lambda m: attnlab.hf.load("x", teacher="teacher/"), f"teacher {MODEL}"),
    (lambda m: attnlab.hf.load("x", model_class="LlamaForCausalLM"),
     "model_class must be a subclass of transformers.PreTrainedModel"),
    (lambda m: attnlab.hf.load("x", gguf_file=Path("m.gguf")), "gguf_file must be a str"),
    (lambda m: attnlab.hf.cores(torch.zeros(2)), f"model {MODEL} .*got torch.Tensor"),
    (lambda m: attnlab.hf.set_inference(None, k=4), f"model {MODEL} .*got NoneType None"),
    (lambda m: attnlab.hf.check_student(m, "teacher"), f"teacher {MODEL}"),
])
def test_wrong_types_name_the_argument(call, words):
    model = make_model("gpt2")
    with pytest.raises(TypeError, match=words):
        call(model)


def test_max_seq_len_must_be_positive():
    with pytest.raises(ValueError, match="max_seq_len must be at least 1, got 0"):
        attnlab.hf.convert(make_model("gpt2"), "sdpa", max_seq_len=0)
