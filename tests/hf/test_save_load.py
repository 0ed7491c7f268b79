"""Saving and loading converted models, and the errors for bad input."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import attnlab.hf
from attnlab.config import ConfigError
from tests.hf.models import FAMILIES, SEA_SPARSE, converted, make_model, outputs, token_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trip(family, tmp_path):
    model = converted(family, "sea", SEA_SPARSE)
    attnlab.hf.set_inference(model, k=3)
    model.save_pretrained(tmp_path)
    torch.manual_seed(123)  # fresh cores would now draw other weights
    loaded = attnlab.hf.load(tmp_path, dtype=torch.float64, teacher=make_model(family))
    assert type(loaded) is type(model)
    assert loaded.config.attnlab == {"core": "sea", "options": {**SEA_SPARSE, "k": 3},
                                     "max_seq_len": 64}
    assert all(c.k == 3 for c in attnlab.hf.cores(loaded))
    ids = token_ids()
    torch.testing.assert_close(outputs(loaded, ids), outputs(model, ids), rtol=0, atol=0)


def test_a_plain_model_folder_loads_unconverted(tmp_path):
    make_model("gpt2").save_pretrained(tmp_path)
    model = attnlab.hf.load(tmp_path)
    assert model.config._attn_implementation != attnlab.hf.ATTN_IMPLEMENTATION
    assert not hasattr(model.config, "attnlab") and model.dtype == torch.float32


def test_missing_and_non_model_folders_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model folder"):
        attnlab.hf.load(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        attnlab.hf.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="the GGUF file model.gguf is not in"):
        attnlab.hf.load(tmp_path, gguf_file="model.gguf")


def test_unsupported_architectures_name_the_supported_ones(tmp_path):
    transformers.MistralConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=64,
                               vocab_size=64).save_pretrained(tmp_path)
    with pytest.raises(attnlab.hf.UnsupportedModelError, match="mistral.*llama.*opt.*gpt2.*bert"):
        attnlab.hf.load(tmp_path)


def test_incompatible_configs_and_options_are_rejected():
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4,
                                     add_cross_attention=True)
    with pytest.raises(attnlab.hf.UnsupportedModelError, match="cross-attention"):
        attnlab.hf.convert(transformers.GPT2LMHeadModel(config))
    model = make_model("llama")
    with pytest.raises(ConfigError, match="did you mean 'k'"):
        attnlab.hf.convert(model, "sea", {"kk": 2})
    with pytest.raises(ConfigError, match="did you mean 'sea'"):
        attnlab.hf.convert(model, "sae")
    with pytest.raises(ValueError, match="not been converted"):
        attnlab.hf.cores(model)
    attnlab.hf.convert(model, "performer")
    with pytest.raises(ValueError, match="already converted"):
        attnlab.hf.convert(model)
    with pytest.raises(ValueError, match="performer core has no inference settings"):
        attnlab.hf.set_inference(model, k=4)
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="custom 4D masks"):
        model(input_ids=token_ids(1, 6), attention_mask=mask)


def test_a_student_that_does_not_match_its_teacher_is_rejected(tmp_path):
    converted("llama", "sea", SEA_SPARSE).save_pretrained(tmp_path)
    bigger = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    with pytest.raises(ValueError, match=r"does not match its teacher: .*\(48,"):
        attnlab.hf.load(tmp_path, teacher=bigger)
    with pytest.raises(ValueError, match="a llama model but the teacher a gpt2"):
        attnlab.hf.load(tmp_path, teacher=make_model("gpt2"))


def test_cores_that_do_not_match_the_saved_config_are_rejected(tmp_path):
    converted("opt", "sea", SEA_SPARSE).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["attnlab"]["options"]["predictor_length"] = 16
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="saved attnlab cores do not match"):
        attnlab.hf.load(tmp_path)
