"""SEA's mask construction, attention on the selected keys, average context and estimate loss
(the sparse attention kernels themselves are :mod:`attnlab.ops.sparse_attention`)."""

from attnlab.ops.sea.attend import (
    attended_keys,
    row_blocks,
    selected_attention,
    selected_attention_naive,
)
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
    "attended_keys",
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
    "row_blocks",
    "select_cell_list",
    "select_cells",
    "selected_attention",
    "selected_attention_naive",
    "upsample_logits",
]
