"""``attnlab long-context``: perplexity and passkey retrieval of a Hugging Face model and its
variants (window, oracle, SEA students, ...) at long contexts, side by side.

Everything is validated (variants, budgets against the lengths, lengths against the model's
positions, prompt sizes, documents long enough) before the first evaluation; nothing is
written until the end. Each variant is built once and evaluated at every length on the same
documents and the same prompts. Records are bench-style JSON; :func:`format_table` prints
them; a passkey cell with fewer than :data:`MIN_PROMPTS` prompts is marked inconclusive.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm

import attnlab.hf
from attnlab.config import ConfigError
from attnlab.data import DataConfig
from attnlab.data.load import open_source
from attnlab.evals.models import Models
from attnlab.evals.passkey import (
    ANSWER_TOKENS,
    answer_prompts,
    check_depth,
    first_number,
    passkey_prompts,
)
from attnlab.evals.perplexity import (
    Scored,
    check_sliding,
    plan_windows,
    ratio_interval,
    sliding_perplexity,
)
from attnlab.evals.variants import ORIGINAL, Variant, parse_variant
from attnlab.layers.registry import check_budget
from attnlab.utils.io import atomic_write_json
from attnlab.utils.provenance import available_cores

logger = logging.getLogger(__name__)

TASKS = ("perplexity", "passkey")
PROTOCOLS = ("sparse", "dense-prefill")
"""Passkey protocols: ``sparse``, the variant reads the whole prompt (its prefill is
sparse too); ``dense-prefill`` (Quest's), the original model prefills the prompt up to the
question once, and each variant decodes the question and its answer from that cache, so
the test isolates decode-time selection."""
MIN_PROMPTS = 20
"""Prompts per (length, depth) cell below which an accuracy is marked inconclusive: with 20,
one answer moves it by 5 points."""
TEACHER_FAILS = 0.5
"""Original-model passkey accuracy below which a cell says the model itself cannot do it."""


@dataclasses.dataclass(frozen=True)
class LongContextConfig:
    """What to evaluate. ``stride``: fraction of the context between sliding windows;
    ``ppl_tokens``: targets scored per length (whole windows, in document order);
    ``ppl_document_tokens``: at most this many of them from one document (None: no cap), so
    that the sample spans several documents;
    ``prompts``: passkey prompts per (length, depth)."""

    lengths: tuple[int, ...] = (2048, 4096, 8192)
    tasks: tuple[str, ...] = TASKS
    corpus: str = "shakespeare"
    split: str = "valid"
    stride: float = 0.5
    ppl_tokens: int = 16384
    ppl_document_tokens: int | None = None
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    prompts: int = MIN_PROMPTS
    passkey_protocols: tuple[str, ...] = ("sparse",)
    seed: int = 0

    def check_positions(self, max_positions: int) -> None:
        """``ConfigError`` for a length beyond the model's positions."""
        for context in self.lengths:
            if context > max_positions:
                raise ConfigError(f"length {context} is outside the model's positions "
                                  f"(max_position_embeddings {max_positions}; no position "
                                  "interpolation)")

    def stride_tokens(self, context: int) -> int:
        return max(1, round(self.stride * context))

    def validate(self) -> None:
        """``ConfigError`` naming the first bad setting."""
        unknown = sorted(set(self.passkey_protocols) - set(PROTOCOLS))
        if unknown or not self.passkey_protocols:
            raise ConfigError(f"passkey protocols must be among {list(PROTOCOLS)}, got "
                              f"{list(self.passkey_protocols)}")
        unknown = set(self.tasks) - set(TASKS)
        if not self.tasks or unknown:
            raise ConfigError(f"tasks must be some of {list(TASKS)}, got {list(self.tasks)}")
        if not self.lengths:
            raise ConfigError("give at least one length")
        if not 0 < self.stride < 1:
            raise ConfigError(f"stride must be a fraction of the context in (0, 1), got "
                              f"{self.stride}")
        for context in self.lengths:
            if context < 2:
                raise ConfigError(f"lengths must be >= 2 tokens, got {context}")
            try:
                check_sliding(context, self.stride_tokens(context))
            except ValueError as err:
                raise ConfigError(f"stride {self.stride} at length {context}: {err}") from err
        if self.ppl_tokens < 1 or self.prompts < 1:
            raise ConfigError("ppl_tokens and prompts must be >= 1")
        if self.ppl_document_tokens is not None and self.ppl_document_tokens < 1:
            raise ConfigError(f"ppl_document_tokens must be >= 1 or None, got "
                              f"{self.ppl_document_tokens}")
        for depth in self.depths:
            try:
                check_depth(depth)
            except ValueError as err:
                raise ConfigError(str(err)) from err


class Evaluation:
    """The documents, prompts and tokenizer shared by every variant."""

    def __init__(self, cfg: LongContextConfig, tokenizer: transformers.PreTrainedTokenizerBase,
                 device: torch.device) -> None:
        self.cfg, self.tokenizer, self.device = cfg, tokenizer, device
        self.documents: list[torch.Tensor] = []
        if "perplexity" in cfg.tasks:
            self.documents = self._documents()
        self.prompts = {}
        if "passkey" in cfg.tasks:
            try:
                self.prompts = {(t, d): passkey_prompts(self.encode, t, d, cfg.prompts, cfg.seed)
                                for t in cfg.lengths for d in cfg.depths}
            except ValueError as err:
                raise ConfigError(str(err)) from err

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]

    def _documents(self) -> list[torch.Tensor]:
        source = open_source(DataConfig(corpus=self.cfg.corpus))
        docs = [torch.tensor(self.encode(text)) for _, text in source.read_documents(
            self.cfg.split)]
        longest = max(self.cfg.lengths)
        if not any(d.numel() > longest for d in docs):
            raise ConfigError(
                f"no document of corpus {self.cfg.corpus!r} ({self.cfg.split}) is longer than "
                f"{longest} tokens (longest: {max(d.numel() for d in docs)}); choose shorter "
                "lengths or another corpus")
        return docs

    def work(self, context: int) -> int:
        """Forwards (perplexity windows + passkey prompts) at ``context``, for progress."""
        plan = plan_windows([d.numel() for d in self.documents], context,
                            self.cfg.stride_tokens(context), self.cfg.ppl_tokens,
                            self.cfg.ppl_document_tokens)
        prompts = len(self.cfg.depths) * self.cfg.prompts * ("passkey" in self.cfg.tasks)
        return len(plan.windows) + prompts * ("sparse" in self.cfg.passkey_protocols)

    def evaluate(self, variant: Variant, model: transformers.PreTrainedModel, context: int,
                 bar: tqdm) -> list[dict[str, Any]]:
        """The records of ``model`` (the variant at ``context``)."""
        base = record_base(variant, context)
        records = []
        if "perplexity" in self.cfg.tasks:
            start = time.perf_counter()
            scored = sliding_perplexity(
                lambda ids: model(input_ids=ids.to(self.device), use_cache=False).logits,
                self.documents, context, self.cfg.stride_tokens(context), self.cfg.ppl_tokens,
                progress=lambda _: bar.update(1), max_document_tokens=self.cfg.ppl_document_tokens)
            shortfall = ppl_shortfall(scored, self.cfg.ppl_tokens, context)
            records.append({**base, "task": "perplexity", "protocol": "sparse",
                            "ppl": scored.ppl, "nll": scored.nll, "tokens": scored.tokens,
                            "window_nll": scored.window_nll,
                            "window_tokens": scored.window_tokens,
                            "documents": scored.documents, "skipped_documents": scored.skipped,
                            "stride": self.cfg.stride_tokens(context),
                            "inconclusive": scored.tokens < self.cfg.ppl_tokens,
                            **({"shortfall": shortfall} if shortfall else {}),
                            "wall_s": time.perf_counter() - start})
        pad = self.tokenizer.pad_token_id
        pad = self.tokenizer.eos_token_id if pad is None else pad

        def generate(ids: torch.Tensor) -> torch.Tensor:
            ids = ids.to(self.device)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=ANSWER_TOKENS, do_sample=False,
                                 pad_token_id=pad)
            return out[:, ids.shape[1]:]

        sparse = "passkey" in self.cfg.tasks and "sparse" in self.cfg.passkey_protocols
        for depth in self.cfg.depths if sparse else ():
            start = time.perf_counter()
            right = answer_prompts(generate, self.tokenizer.decode, self.prompts[context, depth],
                                   progress=bar.update)
            records.append(passkey_record(base, "sparse", depth, right,
                                          time.perf_counter() - start))
        return records

    def dense_prefill(self, base_model: transformers.PreTrainedModel,
                      models: list[tuple[Variant, transformers.PreTrainedModel]], context: int,
                      bar: tqdm) -> list[dict[str, Any]]:
        """The dense-prefill passkey records (:data:`PROTOCOLS`) of every variant at
        ``context``: one dense prefill of each prompt serves them all."""
        records = []
        for depth in self.cfg.depths:
            start = time.perf_counter()
            right: list[list[bool]] = [[] for _ in models]
            for prompt in self.prompts[context, depth]:
                ids = torch.tensor([prompt.ids], device=self.device)
                with torch.no_grad():
                    cache = base_model(input_ids=ids[:, :prompt.question_at],
                                       use_cache=True).cache
                for answers, (_, model) in zip(right, models, strict=True):
                    answer = greedy_from_cache(model, copy.deepcopy(cache),
                                               ids[:, prompt.question_at:], ANSWER_TOKENS)
                    answers.append(first_number(self.tokenizer.decode(answer)) == prompt.key)
                bar.update(1)
            wall = (time.perf_counter() - start) / len(models)
            for answers, (variant, _) in zip(right, models, strict=True):
                records.append(passkey_record(record_base(variant, context), "dense-prefill",
                                              depth, answers, wall))
        return records


def record_base(variant: Variant, context: int) -> dict[str, Any]:
    """The fields every record of ``variant`` at ``context`` starts with (``budget``: keys
    per query token, per KV head for the cores that select per KV head)."""
    return {"bench": "long-context", "variant": variant.label, "seq_len": context,
            "keys_per_row": variant.keys_per_row, "budget": variant.keys_per_row}


def passkey_record(base: dict[str, Any], protocol: str, depth: float, right: list[bool],
                   wall_s: float) -> dict[str, Any]:
    """A passkey record (``wall_s``: a dense-prefill cell's time is shared by its
    variants, so each gets the mean)."""
    return {**base, "task": "passkey", "protocol": protocol, "depth": depth,
            "prompts": len(right), "correct": sum(right), "accuracy": sum(right) / len(right),
            "inconclusive": len(right) < MIN_PROMPTS, "wall_s": wall_s}


@torch.no_grad()
def greedy_from_cache(model: transformers.PreTrainedModel, cache: Any, ids: torch.Tensor,
                      n_tokens: int) -> list[int]:
    """Feed ``ids`` ``[1, n]`` after the prefix in ``cache``, then ``n_tokens`` greedy
    tokens; returns those tokens."""
    out = model(input_ids=ids, cache=cache, use_cache=True)
    tokens = []
    for _ in range(n_tokens):
        token = out.logits[:, -1:].argmax(-1)
        tokens.append(int(token))
        out = model(input_ids=token, cache=out.cache, use_cache=True)
    return tokens


def ppl_shortfall(scored: Scored, asked_tokens: int, context: int) -> str | None:
    """What a perplexity was computed on less of than asked, in words (None: nothing):
    documents skipped as no longer than ``context`` tokens, and fewer targets than
    ``asked_tokens`` (then the figure is inconclusive)."""
    parts = []
    if scored.skipped:
        parts.append(f"{scored.documents} of {scored.documents + scored.skipped} documents "
                     f"({scored.skipped} not longer than {context} tokens)")
    if scored.tokens < asked_tokens:
        parts.append(f"{scored.tokens} of {asked_tokens} tokens: inconclusive")
    return "; ".join(parts) or None


def compare_to_original(records: list[dict[str, Any]]) -> None:
    """Add ``ppl_ratio`` / ``accuracy_ratio`` against the original model's record of the same
    cell (when it was evaluated), and ``original_fails`` where its passkey accuracy is below
    :data:`TEACHER_FAILS` (the cell then measures the model, not the attention)."""
    def cell(r: dict[str, Any]) -> tuple:
        return r["task"], r["seq_len"], r.get("depth"), r.get("protocol")

    original = {cell(r): r for r in records if r["variant"] == ORIGINAL}
    for r in records:
        ref = original.get(cell(r))
        if ref is None:
            continue
        if r["task"] == "perplexity":
            r["ppl_ratio"] = r["ppl"] / ref["ppl"]
            if r["window_tokens"] == ref["window_tokens"] and r["window_tokens"]:
                r["ppl_ratio_ci95"] = list(ratio_interval(r["window_nll"], ref["window_nll"],
                                                          r["window_tokens"]))
        else:
            r["original_fails"] = ref["accuracy"] < TEACHER_FAILS
            if ref["accuracy"] > 0:
                r["accuracy_ratio"] = r["accuracy"] / ref["accuracy"]


def run(model_folder: str | Path, variants: Sequence[Any], cfg: LongContextConfig, *,
        gguf_file: str | None = None, device: str = "cpu", json_path: str | Path | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Evaluate ``variants`` (specs as :func:`~attnlab.evals.variants.parse_variant` takes)
    of the model in ``model_folder``; returns (and writes to ``json_path``) the results."""
    parsed = [parse_variant(v) for v in variants] or [parse_variant(ORIGINAL)]
    labels = [v.label for v in parsed]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"variant labels must differ, got {labels}; set 'label'")
    cfg.validate()
    for variant in parsed:
        if variant.spec is not None:
            check_budget(f"variant {variant.label!r}", variant.spec, min(cfg.lengths))
    base, fingerprint = attnlab.hf.load_fingerprinted(model_folder, gguf_file)
    cfg.check_positions(int(base.config.max_position_embeddings))
    tokenizer = attnlab.hf.load_tokenizer(model_folder, gguf_file=gguf_file)
    torch_device = torch.device(device)
    base = base.to(torch_device).eval()
    evaluation = Evaluation(cfg, tokenizer, torch_device)
    models = Models(base)
    total = len(parsed) * sum(evaluation.work(t) for t in cfg.lengths)
    if "passkey" in cfg.tasks and "dense-prefill" in cfg.passkey_protocols:
        total += len(cfg.lengths) * len(cfg.depths) * cfg.prompts
    records: list[dict[str, Any]] = []
    with tqdm(total=total, disable=not progress, unit="fwd", dynamic_ncols=True) as bar:
        for variant in parsed:
            model = models.build(variant).to(torch_device)
            for context in cfg.lengths:
                bar.set_description(f"{variant.label} @ {context}")
                records += evaluation.evaluate(variant, models.at_length(variant, model, context),
                                               context, bar)
            del model
            gc.collect()
        if "passkey" in cfg.tasks and "dense-prefill" in cfg.passkey_protocols:
            built = [(v, models.build(v).to(torch_device)) for v in parsed]
            for context in cfg.lengths:
                bar.set_description(f"dense prefill @ {context}")
                records += evaluation.dense_prefill(
                    base, [(v, models.at_length(v, m, context)) for v, m in built], context, bar)
            del built
    compare_to_original(records)
    result = {"bench": "long-context", "model": str(Path(model_folder) / (gguf_file or "")),
              "model_sha256": fingerprint, "config": dataclasses.asdict(cfg),
              "variants": [v.to_json() for v in parsed], "device": device,
              "threads": torch.get_num_threads(), "cores": available_cores(),
              "torch": torch.__version__, "records": records}
    if json_path:
        atomic_write_json(Path(json_path), result)
    return result


def _passkey_cell(r: dict[str, Any]) -> str:
    text = f"{r['correct']}/{r['prompts']}"
    if r.get("original_fails"):
        text += " (original fails)"
    return text + ("*" if r["inconclusive"] else "")


def _ratio_cell(r: dict[str, Any]) -> str:
    if "ppl_ratio" not in r:
        return "-"
    interval = r.get("ppl_ratio_ci95")
    return f"{r['ppl_ratio']:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]"
                                       if interval else "")


def format_table(result: dict[str, Any]) -> str:
    """A Markdown table: one row per variant and length (perplexity, its ratio to the
    original with the 95% paired bootstrap interval over windows, passkey answers right per
    protocol and depth; * = fewer than MIN_PROMPTS prompts; † = a perplexity of fewer
    documents or tokens than asked, said under the table), and the model and sample it
    measured."""
    cfg = result["config"]
    protocols = cfg.get("passkey_protocols", ["sparse"])
    passkey = [(p, d) for p in protocols for d in cfg["depths"]] \
        if "passkey" in cfg["tasks"] else []
    head = ["variant", "keys/row", "T"]
    if "perplexity" in cfg["tasks"]:
        head += ["ppl", "x original [95% CI]"]
    head += [f"passkey{' (dense prefill)' if p == 'dense-prefill' else ''} @{round(100 * d)}%"
             for p, d in passkey]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cells: dict[tuple[str, int], dict[Any, Any]] = {}
    for r in result["records"]:
        row = cells.setdefault((r["variant"], r["seq_len"]), {"keys": r["keys_per_row"]})
        key = "ppl" if r["task"] == "perplexity" else (r.get("protocol", "sparse"), r["depth"])
        row[key] = r
    for (label, context), row in cells.items():
        values = [label, str(row["keys"] or "all"), str(context)]
        if "perplexity" in cfg["tasks"]:
            ppl = row["ppl"]
            values += [f"{ppl['ppl']:.3f}" + (" †" if "shortfall" in ppl else ""),
                       _ratio_cell(ppl)]
        values += [_passkey_cell(row[cell]) if cell in row else "-" for cell in passkey]
        lines.append("| " + " | ".join(values) + " |")
    notes = [f"model: {result['model']} (fingerprint {result['model_sha256']})"]
    if "perplexity" in cfg["tasks"]:
        notes.append(f"perplexity: sliding windows, stride {cfg['stride']} x T, about "
                     f"{cfg['ppl_tokens']} targets per length from corpus {cfg['corpus']} "
                     f"({cfg['split']}); interval: 95% paired bootstrap over windows")
        shortfalls = {(r["seq_len"], r["shortfall"]): None for r in result["records"]
                      if "shortfall" in r}
        notes += [f"† at T={context}: {text}" for context, text in shortfalls]
    if passkey:
        notes.append(f"passkey: {cfg['prompts']} prompts per cell, greedy"
                     + (f"; * = fewer than {MIN_PROMPTS}: inconclusive"
                        if cfg["prompts"] < MIN_PROMPTS else ""))
    return "\n".join(lines) + "\n\n" + "\n".join(notes)
