"""Tiny randomly initialised models of each supported family, in float64."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import transformers

import attnlab.hf

CAUSAL = ["llama", "opt", "gpt2"]
FAMILIES = [*CAUSAL, "bert"]
SPECIAL_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
VOCAB = 64
CONFIGS = {
    "llama": transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        **SPECIAL_TOKENS),
    "opt": transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
        word_embed_proj_dim=32, max_position_embeddings=64, **SPECIAL_TOKENS),
    "gpt2": transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, **SPECIAL_TOKENS),
    "bert": transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, pad_token_id=0),
}
SEA_SPARSE = {"k": 2, "predictor_length": 8}  # T = 24: rows keep a few of their keys
SEA_ALL_KEYS = {"k": 64, "predictor_length": 8, "output": "mix"}  # every key of every row


def make_model(family: str, seed: int = 0):
    """A tiny random model of ``family`` (float64, eval mode); a fresh config each time
    (``from_config`` mutates the one it is given)."""
    torch.manual_seed(seed)
    config = copy.deepcopy(CONFIGS[family])
    cls = transformers.AutoModel if family == "bert" else transformers.AutoModelForCausalLM
    return cls.from_config(config).double().eval()


def converted(family: str, core: str = "sea", options=None, seed: int = 0):
    return attnlab.hf.convert(make_model(family, seed), core, options)


def open_gates(model) -> None:
    """sigmoid(s0) = sigmoid(s1) = 1 on every SEA layer: the output is the sparse attention
    alone, so SEA with every key selected is exact attention."""
    with torch.no_grad():
        for core in attnlab.hf.cores(model):
            core.estimator.scalers.weight.zero_()
            core.estimator.scalers.bias.fill_(60.0)


def outputs(model, ids, mask=None):
    """Logits (causal LMs) or last hidden states (BERT) ``[B, T, .]``."""
    out = model(input_ids=ids, attention_mask=mask)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def token_ids(batch: int = 2, length: int = 24, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=gen)


TOKENIZER_VOCAB = 320  # the byte-level tokenizer's 256 bytes, a few merges and 4 special tokens


def save_model(family: str, folder: Path, tokenizer, **config) -> Path:
    """A tiny random float32 model of ``family`` sized for ``tokenizer``'s vocabulary, saved
    with it in ``folder`` (``config``: overrides, e.g. ``max_position_embeddings``)."""
    cfg = copy.deepcopy(CONFIGS[family])
    cfg.vocab_size = TOKENIZER_VOCAB
    for name, value in config.items():
        setattr(cfg, name, value)
    torch.manual_seed(0)
    cls = transformers.AutoModel if family == "bert" else transformers.AutoModelForCausalLM
    cls.from_config(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
