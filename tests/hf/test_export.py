"""attnlab models as Hugging Face models: export, the Auto classes, generate with the model's
own cache, the round trip and bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers

import attnlab.hf
from attnlab.cli import main
from attnlab.config import from_dict
from attnlab.hf.native import AttnlabForCausalLM
from attnlab.layers import CORES
from attnlab.models import DecoderLM, ModelConfig
from attnlab.train import load_run_config, train
from attnlab.train.run import load_run
from attnlab.utils.testing import assert_close
from tests.helpers import tiny_run_config

PROMPT = "import collections\n"
BASE = {"vocab_size": 64, "d_model": 32, "n_layers": 2, "d_ff": 48, "max_seq_len": 64,
        "attention": {"n_heads": 2}}
SMALL_CORE_OPTIONS = {"sea": {"k": 2, "predictor_length": 8}, "oracle": {"k": 4},
                      "window": {"window": 8}, "reformer": {"bucket_size": 8},
                      "quest": {"budget": 8, "page": 2}, "block": {"budget": 8, "page": 2},
                      "sea_pages": {"budget": 8, "page": 2}}
VARIANTS = {
    **{f"core-{name}": {"attention": {"n_heads": 2, "core": {"name": name,
                                                              **SMALL_CORE_OPTIONS.get(name, {})}}}
       for name in CORES.names()},
    "switchhead": {"attention": {"n_heads": 2, "projections": {"name": "switchhead",
                                                               "n_experts": 4, "k": 2}}},
    "moa": {"attention": {"n_heads": 2, "projections": {"name": "moa", "n_experts": 4}}},
    "switchall": {"mlp": {"name": "sigma_moe", "n_experts": 4, "k": 2},
                  "attention": {"n_heads": 2, "projections": {"name": "switchhead",
                                                              "n_experts": 4, "k": 2}}},
    "llama": {"norm": "rmsnorm", "mlp": "swiglu", "tie_embeddings": False,
              "attention": {"n_heads": 2, "projections": {"name": "dense", "n_kv_heads": 1}}},
    "xl-memory": {"memory_len": 16, "attention": {"n_heads": 2, "positions": "xl"}},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_part_works_through_the_hugging_face_model(variant, tmp_path):
    cfg = from_dict(ModelConfig, {**BASE, **VARIANTS[variant]}, "model")
    cfg.validate()
    torch.manual_seed(0)
    model = DecoderLM(cfg).eval()
    hf = attnlab.hf.from_decoder(model)
    hf.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, AttnlabForCausalLM)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close("logits", model(ids).logits, loaded(input_ids=ids).logits, 1e-6)
        ours = model.generate(ids, 10, temperature=0)
        theirs = loaded.generate(ids, max_new_tokens=10, do_sample=False)
    assert torch.equal(ours, theirs)


def test_labels_give_the_models_next_token_loss():
    torch.manual_seed(0)
    model = DecoderLM(from_dict(ModelConfig, BASE, "model")).eval()
    hf = attnlab.hf.from_decoder(model)
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        expected = model(ids[:, :-1], targets=ids[:, 1:]).loss
        loss = hf(input_ids=ids, labels=ids).loss
    # the model's loss over T-1 inputs equals the label loss over T (the last has no target)
    assert_close("loss", expected, loss, 1e-6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, text_corpus):
    """Finished tiny runs: dense (byte tokenizer), SwitchHead and SEA (BPE tokenizer)."""
    root = tmp_path_factory.mktemp("runs")
    base = tiny_run_config(text_corpus, root / "cache", steps=4, batch_size=2)
    attention = {"dense": {"n_heads": 2},
                 "switchhead": {"n_heads": 2, "projections": {"name": "switchhead",
                                                              "n_experts": 4, "k": 2}},
                 "sea": {"n_heads": 2, "core": {"name": "sea", "k": 4,
                                                 "predictor_length": 8}}}
    for name, att in attention.items():
        data = base["data"] if name == "dense" else {**base["data"], "tokenizer": "bpe",
                                                     "vocab_size": 300}
        cfg = {**base, "data": data, "model": {**base["model"], "attention": att}}
        train(load_run_config(base=cfg), root / name, progress=False)
    return root


@pytest.mark.parametrize("name", ["dense", "switchhead", "sea"])
def test_exported_run_generates_what_attnlab_generate_does(runs, name, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", "--run", str(runs / name), "--out", str(out)]) == 0
    assert f"saved {out}" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "generation_config.json"} <= {p.name for p in out.iterdir()}
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    run = load_run(runs / name)
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == run.tokenizer.encode(PROMPT)  # the run's own tokenizer
    generated = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert main(["generate", "--run", str(runs / name), "--prompt", PROMPT,
                 "--max-new-tokens", "12", "--temperature", "0"]) == 0
    expected = capsys.readouterr().out.rstrip("\n")
    assert tokenizer.decode(generated[0]) == expected
    # round trip: save_pretrained / from_pretrained keep every weight
    model.save_pretrained(tmp_path / "again")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    for (key, a), b in zip(model.state_dict().items(), again.state_dict().values(),
                           strict=True):
        assert torch.equal(a, b), key
    assert isinstance(attnlab.hf.load(out), AttnlabForCausalLM)


def test_bad_exports_are_refused(runs, tmp_path, capsys):
    assert main(["export", "--run", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "not an attnlab run folder" in capsys.readouterr().err
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((runs / "dense" / "config.yaml").read_text())
    assert main(["export", "--run", str(unfinished), "--out", str(tmp_path / "x")]) == 2
    assert "not a finished run" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_without_attnlab_transformers_names_the_model_type(runs, tmp_path):
    """A process that has not imported attnlab.hf cannot build the model; transformers'
    error names the model type, ``attnlab``."""
    attnlab.hf.export_run(runs / "dense", tmp_path / "hf")
    code = ("import transformers; transformers.AutoModelForCausalLM.from_pretrained("
            f"{str(tmp_path / 'hf')!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"HF_HUB_OFFLINE": "1", "PATH": ""}, timeout=120)
    assert done.returncode != 0 and "attnlab" in done.stderr
