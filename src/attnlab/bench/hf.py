"""``attnlab bench hf``: a whole Hugging Face model, original vs converted, side by side.

For each context length ``T`` the original model (its own attention, e.g. SDPA) and a copy
converted with :func:`attnlab.hf.convert` to each given core are timed together
(``time_side_by_side``, reps alternating) on the same random prompt ``[batch, T]``:

* ``op: forward``: one forward of the prompt without KV cache (latency of a full pass);
* ``op: generate``: ``model.generate`` of ``new_tokens`` greedy tokens after the prompt with
  the KV cache (the prefill included; decoding carries the cores' states with the cache).

Records follow :mod:`attnlab.results`'s schema (``bench: "hf"``, ``pass: "fwd"``,
baseline ``original``); the summary gives, per model and length, ``generate_tokens_per_s``
(``batch * new_tokens`` over the generate time) and ``decode_tokens_per_s`` (over the generate
time less the forward time, i.e. the cached decoding alone, approximately).

The default model is a small random Llama (grouped-query, RoPE; :func:`tiny_llama`), so the
command runs with transformers alone; ``model`` names a model folder (``gguf_file`` a GGUF
file in it, e.g. SmolLM2-135M). The converted cores are untrained: this measures speed, not
quality (``attnlab distill`` trains them).
"""

from __future__ import annotations

import copy
import logging
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import Tensor

import attnlab.hf
from attnlab.config import ConfigError, PartSpec
from attnlab.layers import CORES
from attnlab.results import (
    Record,
    fill_ratios,
    fwd,
    peak_memory_mb,
    time_side_by_side,
    write_json,
)
from attnlab.results.serve import BASELINE
from attnlab.utils.provenance import config_fingerprint, model_fingerprint

logger = logging.getLogger(__name__)

BENCH = "hf"
DEFAULT_SEQ_LENS = (256, 512, 1024, 2048)
TINY_MODEL = "tiny-llama"
TINY_LLAMA = {"vocab_size": 2048, "hidden_size": 256, "intermediate_size": 688,
              "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
              "max_position_embeddings": 8192}
"""The default model: a random Llama of about 7M parameters, SmolLM2's shape in miniature
(grouped-query attention, 32-wide heads, RoPE)."""


def tiny_llama(seed: int = 0) -> transformers.PreTrainedModel:
    """A random :data:`TINY_LLAMA` ``LlamaForCausalLM`` (float32, eval mode)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**TINY_LLAMA)
    return transformers.LlamaForCausalLM(config).eval()


def tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE fast tokenizer of a few hundred ids (any text encodes)."""
    from attnlab.data.tokenizers import train_bpe

    bpe = train_bpe(["the quick brown fox jumps over the lazy dog"] * 4, 270)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", unk_token="[UNK]")


def save_tiny_llama(folder: str | os.PathLike[str], seed: int = 0, **config: Any) -> Path:
    """A random :data:`TINY_LLAMA` (``config`` overrides, e.g. ``num_hidden_layers``) sized
    for :func:`tiny_tokenizer`, saved with it in ``folder``: a Hugging Face model folder for
    smoke runs of commands that take one."""
    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{**TINY_LLAMA, "vocab_size": len(tokenizer), **config}))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def core_specs(cores: Sequence[str | dict | PartSpec]) -> list[PartSpec]:
    """Validated core specs (names or ``{name: ..., option: value}`` mappings; one core may
    come with several option sets); raises ``ConfigError`` for an unknown core or option, or
    a spec given twice."""
    specs = [PartSpec.parse(c, f"core {c!r}") if not isinstance(c, PartSpec) else c
             for c in cores]
    for spec in specs:
        CORES.options(spec)
    names = model_names(specs)
    if not specs or len(set(names)) != len(names) or BASELINE in names:
        raise ConfigError(f"give one or more distinct cores (not {BASELINE!r}), got {names}")
    return specs


def load_original(model: str | None = None, *, gguf_file: str | None = None,
                  seed: int = 0) -> tuple[transformers.PreTrainedModel, str]:
    """The original model in eval mode and its label in the records: :func:`tiny_llama`
    (``seed``) and :data:`TINY_MODEL` when ``model`` is None, else the Hugging Face folder
    ``model`` (``gguf_file``: a GGUF file in it) and its name (``folder/file.gguf``)."""
    if model is None:
        return tiny_llama(seed), TINY_MODEL
    label = Path(model).name + ("" if gguf_file is None else f"/{gguf_file}")
    return attnlab.hf.load(model, gguf_file=gguf_file).eval(), label


def original_fingerprint(model: str | None = None, *, gguf_file: str | None = None,
                         seed: int = 0) -> str:
    """The fingerprint of :func:`load_original`'s model: of its files
    (:func:`attnlab.utils.provenance.model_fingerprint`), or of :data:`TINY_LLAMA` and
    ``seed`` when ``model`` is None."""
    if model is None:
        return config_fingerprint({**TINY_LLAMA, "seed": seed})
    return model_fingerprint(attnlab.hf.check_model_folder(model, gguf_file), gguf_file)


def check_max_length(original: transformers.PreTrainedModel, length: int) -> None:
    """Raise ``ConfigError`` when ``length`` positions exceed the model's
    ``max_position_embeddings``."""
    limit = original.config.max_position_embeddings
    if length > limit:
        raise ConfigError(f"seq_len {length} exceeds the model's max_position_embeddings "
                          f"{limit}")


def model_names(specs: Sequence[PartSpec]) -> list[str]:
    """The records' name of each converted core: its core name, or with its options when
    two specs share a core (``window(window=252)``)."""
    counts = Counter(s.name for s in specs)
    return [s.name if counts[s.name] == 1 else
            f"{s.name}({','.join(f'{k}={v}' for k, v in sorted(s.options.items()))})"
            for s in specs]


def side_by_side(original: transformers.PreTrainedModel, specs: Sequence[PartSpec],
                 seed: int = 0) -> dict[str, transformers.PreTrainedModel]:
    """``{BASELINE: original, name: a deep copy converted to that core (eval mode)}`` (names
    from :func:`model_names`), each conversion seeded with ``seed`` (same initial core
    weights whatever the order)."""
    names = model_names(specs)
    models = {BASELINE: original}
    for name, spec in zip(names, specs, strict=True):
        torch.manual_seed(seed)
        models[name] = attnlab.hf.convert(copy.deepcopy(original), spec.name,
                                          spec.options).eval()
    return models


def add_options(records: Sequence[Record], specs: Sequence[PartSpec]) -> None:
    """Add each converted core's options to the shape of its records (in place). Call it
    after ``fill_ratios``: options are per core, while ratios group records by shape."""
    options = {name: dict(s.options) for name, s in zip(model_names(specs), specs, strict=True)
               if s.options}
    for r in records:
        if r.name in options:
            r.shape = {**r.shape, "options": options[r.name]}


def _shape(model: str, op: str, seq_len: int, batch: int, new_tokens: int | None,
           dtype: torch.dtype) -> dict[str, Any]:
    shape: dict[str, Any] = {"model": model, "op": op, "seq_len": seq_len, "batch": batch}
    if new_tokens is not None:
        shape["new_tokens"] = new_tokens
    return {**shape, "dtype": str(dtype).removeprefix("torch.")}


def _calls(model: transformers.PreTrainedModel, ids: Tensor,
           new_tokens: int) -> dict[str, Callable[[], object]]:
    """The timed calls of one model on the prompt ``ids``: forward, and generate when the
    model is a generating (causal) one."""
    calls: dict[str, Callable[[], object]] = {
        "forward": fwd(lambda: model(input_ids=ids, use_cache=False)[0])}
    if model.can_generate():
        pad = model.generation_config.pad_token_id
        pad = model.generation_config.eos_token_id if pad is None else pad

        def generate() -> None:
            model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=pad)

        calls["generate"] = generate
    return calls


def run(
    model: str | None = None,
    *,
    gguf_file: str | None = None,
    cores: Sequence[str | dict | PartSpec] = ("sea",),
    seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
    batch: int = 1,
    new_tokens: int = 32,
    reps: int = 5,
    json_path: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
) -> list[Record]:
    """Benchmark the original model against each converted core at every length
    (ascending); returns the records, ratios against ``original`` filled, and writes the
    JSON (with :func:`summarize`'s summary) when ``json_path`` is given.

    ``model``: a Hugging Face model folder (None: :func:`tiny_llama`); ``gguf_file``: a GGUF
    file in it. ``cores``: core names or mappings with options (e.g. ``{"name": "sea", "k":
    64, "predictor_length": 64}``)."""
    specs = core_specs(cores)
    lengths = sorted(set(seq_lens))
    if not lengths or lengths[0] < 1 or batch < 1 or new_tokens < 1:
        raise ValueError(f"seq_lens, batch and new_tokens must be positive, got "
                         f"{list(seq_lens)}, {batch}, {new_tokens}")
    dev = torch.device(device)
    original, label = load_original(model, gguf_file=gguf_file, seed=seed)
    check_max_length(original, max(lengths))
    models = {name: m.to(dev) for name, m in side_by_side(original, specs, seed).items()}
    dtype = next(original.parameters()).dtype
    gen = torch.Generator().manual_seed(seed)
    records: list[Record] = []
    for seq_len in lengths:
        ids = torch.randint(0, original.config.vocab_size, (batch, seq_len),
                            generator=gen).to(dev)
        calls = {name: _calls(m, ids, new_tokens) for name, m in models.items()}
        for op in calls[BASELINE]:
            fns = {name: c[op] for name, c in calls.items()}
            timings = time_side_by_side(fns, reps, device=dev)
            for name, fn in fns.items():
                timing = timings[name]
                shape = _shape(label, op, seq_len, batch, new_tokens if op == "generate"
                               else None, dtype)
                records.append(Record(BENCH, name, "fwd", shape, timing.median, timing.min,
                                      peak_memory_mb(fn, dev)))
                logger.info("%s T=%d %s: %.1f ms (min %.1f)", op, seq_len, name,
                            timing.median, timing.min)
    fill_ratios(records, BASELINE)
    add_options(records, specs)
    if json_path is not None:
        write_json(json_path, records, summary=summarize(records))
    return records


def summarize(records: Sequence[Record]) -> dict[str, dict[str, dict[str, float]]]:
    """``generate_tokens_per_s`` and ``decode_tokens_per_s`` per model name and length (as a
    string key), from the generate records and the forward ones of the same length."""
    forward = {(r.name, r.shape["seq_len"]): r.ms_median for r in records
               if r.shape["op"] == "forward"}
    total: dict[str, dict[str, float]] = {}
    decode: dict[str, dict[str, float]] = {}
    for r in records:
        if r.shape["op"] != "generate":
            continue
        tokens = r.shape["batch"] * r.shape["new_tokens"]
        key = str(r.shape["seq_len"])
        total.setdefault(r.name, {})[key] = tokens / (r.ms_median / 1e3)
        decode_ms = r.ms_median - forward.get((r.name, r.shape["seq_len"]), 0.0)
        if decode_ms > 0:
            decode.setdefault(r.name, {})[key] = tokens / (decode_ms / 1e3)
    return {"generate_tokens_per_s": total, "decode_tokens_per_s": decode}


def format_summary(records: Sequence[Record]) -> str:
    """Markdown: per length, forward ms and generate tokens/s of every model (x original)."""
    names = list(dict.fromkeys(r.name for r in records))
    cell = {(r.shape["op"], r.shape["seq_len"], r.name): r for r in records}
    rates = summarize(records)["generate_tokens_per_s"]
    lines = ["| seq_len | " + " | ".join(f"{n} forward ms" for n in names) + " | "
             + " | ".join(f"{n} generate tok/s" for n in names) + " |",
             "|" + "---|" * (2 * len(names) + 1)]
    for t in sorted({r.shape["seq_len"] for r in records}):
        forward = []
        for n in names:
            r = cell.get(("forward", t, n))
            forward.append("" if r is None else f"{r.ms_median:.1f} ({r.ratio:.2f}x)")
        tokens = [f"{rates[n][str(t)]:.1f}" if str(t) in rates.get(n, {}) else ""
                  for n in names]
        lines.append(f"| {t} | " + " | ".join(forward + tokens) + " |")
    return "\n".join(lines)
