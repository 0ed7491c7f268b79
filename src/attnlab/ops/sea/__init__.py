"""SEA's mask construction, average context and estimate loss (the sparse attention itself is
:mod:`attnlab.ops.sparse_attention`)."""

from attnlab.ops.sea.context import causal_mean, estimate_weighted_mean
from attnlab.ops.sea.loss import attention_distill_loss, estimate_loss, upsample_logits
from attnlab.ops.sea.mask import (
    GROUPS,
    bin_edges,
    cell_budget,
    cell_runs,
    decompress,
    dense_mask_reference,
    rank_bins,
    select_cell_list,
    select_cells,
)

__all__ = [
    "GROUPS",
    "attention_distill_loss",
    "bin_edges",
    "causal_mean",
    "cell_budget",
    "cell_runs",
    "decompress",
    "dense_mask_reference",
    "estimate_loss",
    "estimate_weighted_mean",
    "rank_bins",
    "select_cell_list",
    "select_cells",
    "upsample_logits",
]
