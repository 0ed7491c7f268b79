"""Issue #34's "selector <= 25% of the attention per decode step at 8k batch 8": one layer's
step of the page selectors in SmolLM2-135M's shape (9 query heads, 3 KV heads of 64, pages
of 16, 256 keys per query token per KV head), timed side by side (alternating rounds,
medians) as the one native call (score the pages, select, attend) and as the attention alone
over the same selection (the run kernel, given the pages). Their difference is the
selector's cost. Random keys, float32, 2 threads; the estimator is sea_pages' shipped one
(layer 15); Quest's features are per KV head. ``sea_pages_bf16_features``: sea_pages with
``feature_dtype: bfloat16`` (its features read in 16 bits). Writes breakdown.json beside
this file.

Run from the repository root: .venv/bin/python docs/results/serve-sea-pages-cpu/breakdown.py
"""

import json
from pathlib import Path

import torch

from attnlab.config import PartSpec
from attnlab.layers import CORES, LayerContext
from attnlab.layers.pages import FEATURE_DTYPES
from attnlab.ops.attention.masks import key_ranks
from attnlab.ops.attention.page_rules import page_masks, select_pages
from attnlab.ops.attention.page_scorers import scorer_logits, scorer_of
from attnlab.ops.attention.page_step import attend_best_pages
from attnlab.ops.attention.pages import all_page_features
from attnlab.ops.sparse_attention.pages import PageSelection, attend_pages, pages_from_kept
from attnlab.results import machine_info, time_side_by_side

B, H, HK, D, T, PAGE, BUDGET, SINKS, LOCAL = 8, 9, 3, 64, 8192, 16, 256, 1, 1
torch.set_num_threads(2)
ctx = LayerContext(d_model=H * D, n_heads=H, d_head=D, n_layers=30, layer_idx=15)
SEA = {"budget": BUDGET, "estimators": "smollm2-135m"}
cores = {
    "quest": CORES.build(PartSpec("quest", {"budget": BUDGET}), ctx=ctx, dropout=0.0),
    "sea_pages": CORES.build(PartSpec("sea_pages", SEA), ctx=ctx, dropout=0.0),
    "sea_pages_bf16_features": CORES.build(
        PartSpec("sea_pages", {**SEA, "feature_dtype": "bfloat16"}), ctx=ctx, dropout=0.0),
}
gen = torch.Generator().manual_seed(0)
q = torch.randn(B, H, 1, D, generator=gen)
k, v = (torch.randn(B, HK, T, D, generator=gen) for _ in range(2))
ranks = key_ranks(None, B, T, None)
n_real = torch.full((B,), T)
q_ranks = ranks[:, -1:]
KW = dict(page=PAGE, sink_pages=SINKS, local_pages=LOCAL, causal=True, scale=D ** -0.5)
results = {}
for name, core in cores.items():
    scorer = scorer_of(core.scorer)
    features = all_page_features(k, ranks, PAGE, scorer,
                                 FEATURE_DTYPES[core.options.feature_dtype])
    with torch.no_grad():
        logits = scorer_logits(scorer, q, features.to(q.dtype), q_ranks // PAGE, D ** -0.5)
        readable, forced = page_masks(n_real, q_ranks, features.shape[2], PAGE, SINKS, LOCAL,
                                      True)
        kept = select_pages(logits, HK, readable, forced, BUDGET // PAGE - SINKS - LOCAL)
        selection = PageSelection(pages_from_kept(kept, BUDGET // PAGE), PAGE, q_ranks + 1,
                                  None)

        def step(scorer=scorer, features=features):
            return attend_best_pages(q, k, v, scorer=scorer, features=features,
                                     q_ranks=q_ranks, n_real=n_real, budget=BUDGET,
                                     rank_to_pos=None, **KW)

        def attention(selection=selection):
            return attend_pages(q, k, v, selection, scale=D ** -0.5)

        times = time_side_by_side({"step": step, "attention": attention}, reps=200,
                                  warmup=20)
    step_ms, attention_ms = times["step"].median, times["attention"].median
    results[name] = {"step_ms": step_ms, "attention_ms": attention_ms,
                     "selector_ms": step_ms - attention_ms,
                     "selector_share_of_attention": (step_ms - attention_ms) / attention_ms,
                     "features_per_page": features.shape[1] * features.shape[-1],
                     "feature_dtype": str(features.dtype).removeprefix("torch.")}
    print(f"{name}: step {step_ms:.3f} ms = attention {attention_ms:.3f} ms + selector "
          f"{step_ms - attention_ms:.3f} ms ({(step_ms - attention_ms) / attention_ms:.0%} of "
          "the attention)")
out = {"machine": machine_info(), "shape": {"batch": B, "heads": H, "kv_heads": HK,
                                            "d_head": D, "seq_len": T, "page": PAGE,
                                            "budget": BUDGET},
       "reps": 200, "results": results}
(Path(__file__).parent / "breakdown.json").write_text(json.dumps(out, indent=2) + "\n")
