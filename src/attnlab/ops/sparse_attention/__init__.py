"""Exact attention on a per-row set of keys (SEA's inner op): gather fast paths and references.

``sparse_attention``: padded key lists per (head, row). ``cell_attention``: per row, a padded
list of cells (one head's run of keys each), for selections split unevenly across heads.
``run_attention``: the same cells described as runs of ranks, with a native CPU kernel.
:mod:`.pages`: the page selectors' selection format (``PageSelection``) and its executors;
:mod:`.flex`: the FlexAttention executor (block mask from the selection); :mod:`.executors`:
which executor runs, decided in one place.
"""

from attnlab.ops.sparse_attention.cells import cell_attention
from attnlab.ops.sparse_attention.gather import sparse_attention
from attnlab.ops.sparse_attention.naive import (
    cell_attention_naive,
    cell_mask,
    index_mask,
    masked_attention,
    sparse_attention_naive,
)
from attnlab.ops.sparse_attention.runs import run_attention, run_attention_naive, run_keys

__all__ = [
    "cell_attention",
    "cell_attention_naive",
    "cell_mask",
    "index_mask",
    "masked_attention",
    "run_attention",
    "run_attention_naive",
    "run_keys",
    "sparse_attention",
    "sparse_attention_naive",
]
