"""The distilled SmolLM2 student at 4x its distillation context with other key budgets.

Usage: python eval_long_k.py RUN_DIR K [K ...]  (RUN_DIR: an `attnlab distill` output folder).
Evaluates the student saved in RUN_DIR/student as the distillation's `long_context` entry does
(SEA position tables stretched by nearest neighbour, the model's own RoPE positions) on the
same held-out tokens (`final_eval_tokens`), after `set_inference(k=K)`.
"""

import sys

import torch

import attnlab.hf
from attnlab.distill import load_distill_config
from attnlab.distill.hf import open_hf_pair

run_dir, ks = sys.argv[1], [int(k) for k in sys.argv[2:]]
cfg = load_distill_config(f"{run_dir}/distill.yaml")
pair = open_hf_pair(cfg, torch.device("cpu"))
pair.student = attnlab.hf.load(f"{run_dir}/student")
factor = cfg.distill.long_context
longer = pair.extended(pair.student, factor)
for k in ks:
    attnlab.hf.set_inference(longer, k=k)
    result = pair.evaluate_model(longer, pair.seq_len * factor, cfg.distill.final_eval_tokens)
    print(f"k={k} at {pair.seq_len * factor} tokens: {result}", flush=True)
