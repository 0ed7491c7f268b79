"""Where the FlexAttention executor's prefill time goes on CPU: one causal prefill of a page
selector in SmolLM2-135M's layer shape (9 query heads, 3 KV heads of 64), Quest at 256 keys
per query token per KV head in pages of 16, random inputs, timed side by side (alternating
rounds, medians) against the native executor and SDPA:

- ``select``: the rows' selection in PyTorch ops (``select_page_rows``);
- ``block_mask``: the selection as FlexAttention's block mask (``page_block_mask``);
- ``flex_total``: ``paged_attention(..., executor="flex")`` (all three);
- ``native``: ``paged_attention`` on the native kernel (scores, selects, attends in one call);
- ``sdpa``: dense causal attention.

- ``flex_kernel_q{16,32,64,128}``: the compiled kernel (``flex_attend``) with tiles of that
  many query rows (the default on CPU is 16), with the share of key blocks those tiles read (the union of the
  pages of each tile's rows);
- ``window_torch``, ``window_flex``: 4 sinks + a 252-key window (the same budget) on the
  ``torch`` executor (blocks of queries over the keys they span) and on ``flex``.

Writes breakdown.json beside this file.

Run from the repository root: .venv/bin/python docs/results/flex-executor-cpu/breakdown.py
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.ops.attention.pages import paged_attention, select_page_rows
from attnlab.ops.attention.window import window_attention
from attnlab.ops.sparse_attention.flex import flex_attend, page_block_mask
from attnlab.results import machine_info, time_side_by_side

B, H, HK, D, PAGE, BUDGET = 1, 9, 3, 64, 16, 256
LENGTHS = [int(x) for x in sys.argv[1:]] or [4096, 8192]
torch.set_num_threads(2)
KW = dict(scale=D ** -0.5, budget=BUDGET, page=PAGE, scorer="quest", sink_pages=1,
          local_pages=1, causal=True, key_padding_mask=None)
results = []
for t in LENGTHS:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, t, D, generator=gen)
    k, v = (torch.randn(B, HK, t, D, generator=gen) for _ in range(2))
    with torch.no_grad():
        selection = select_page_rows(q, k, **KW)
        fns = {
            "select": lambda: select_page_rows(q, k, **KW),
            "block_mask": lambda: page_block_mask(selection, H, t),
            "flex_total": lambda: paged_attention(q, k, v, **KW, executor="flex"),
            "native": lambda: paged_attention(q, k, v, **KW),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                           enable_gqa=True),
            **{f"window_{ex}": lambda ex=ex: window_attention(
                q, k, v, scale=KW["scale"], sinks=4, window=BUDGET - 4, executor=ex)
               for ex in ("torch", "flex")},
        }
        density = {}
        for q_block in (16, 32, 64, 128):
            mask = page_block_mask(selection, H, t, q_block=q_block)
            density[q_block] = round(float(mask.kv_num_blocks.float().mean()) / (t // PAGE), 4)
            fns[f"flex_kernel_q{q_block}"] = lambda mask=mask: flex_attend(
                q, k, v, mask, scale=KW["scale"])
        timings = time_side_by_side(fns, reps=5)
    row = {"seq_len": t, **{f"{n}_ms": round(x.median, 1) for n, x in timings.items()},
           "share_of_key_blocks_read": density}
    print(row, flush=True)
    results.append(row)
out = {"machine": machine_info(), "threads": torch.get_num_threads(), "batch": B,
       "heads": H, "kv_heads": HK, "d_head": D, "page": PAGE, "budget": BUDGET,
       "dtype": "float32", "reps": 5, "results": results}
Path(__file__).with_name("breakdown.json").write_text(json.dumps(out, indent=1) + "\n")
