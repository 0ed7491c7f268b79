"""SEA's estimated attention, read out of a model: which tokens each layer expects to matter.

SEA's estimator predicts every query row's attention, compressed into ``K`` bins over the
row's own keys, before any exact score is computed; a fused dense kernel never forms the
attention it computes. :func:`record_estimates` collects those estimates from every SEA core
of a model (attnlab or Hugging Face) during the forwards run inside it:

    with record_estimates(model) as estimates:
        model(input_ids)
    estimates[0].compressed          # layer 0: [B, H, T, K] probabilities over each row's bins
    estimates[0].dense()             # [B, H, T, T] over key positions (each bin spread evenly)
    estimates[0].key_importance()    # [B, T]: the attention each key is expected to receive
    estimates[0].attended()          # [B, H, T, T] bool: the keys the exact attention used

One :class:`SEAEstimate` per call of a core, in call order (a layer's cores are called once
per forward; a long causal prefill at inference calls each core once per block of rows).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from attnlab.ops.sea import attended_keys, bin_edges, rank_bins
from attnlab.utils.arguments import require_type


@dataclasses.dataclass(frozen=True)
class SEAEstimate:
    """One SEA core's estimate for one call.

    compressed: ``[B, H, Tq, K]`` the estimated attention of each query row over its ``K``
    bins (each row's bins stretched over the ``lengths`` keys it sees; empty bins 0).
    lengths: ``[B, Tq]``; rank_to_pos: ``[B, Tk]`` key position of each rank among the real
    keys, or None (rank = position); n_keys: ``Tk``. ranking: ``[B, H, Tq, K]`` what the
    core's top-k ranked (the estimate with its tie-breaking; rows left out negative), with
    its key budget ``k`` and grouping ``group``.
    """

    compressed: Tensor
    lengths: Tensor
    rank_to_pos: Tensor | None
    n_keys: int
    ranking: Tensor
    k: int
    group: str

    def dense(self) -> Tensor:
        """``[B, H, Tq, Tk]``: each bin's probability spread evenly over the bin's keys, at
        the keys' positions (rows sum to 1, as the estimate's; keys a row does not see 0)."""
        n_bins = self.compressed.shape[-1]
        bins, exists = rank_bins(self.lengths, self.n_keys, n_bins)  # [B, Tq, Tk] by rank
        edges = bin_edges(self.lengths, n_bins)
        width = (edges[..., 1:] - edges[..., :-1]).clamp_min(1)
        per_key = self.compressed / width.unsqueeze(1).to(self.compressed.dtype)
        index = bins.unsqueeze(1).expand(*self.compressed.shape[:3], self.n_keys)
        by_rank = per_key.gather(-1, index).masked_fill(~exists.unsqueeze(1), 0.0)
        if self.rank_to_pos is None:
            return by_rank
        positions = self.rank_to_pos[:, None, None, :].expand_as(by_rank)
        return torch.zeros_like(by_rank).scatter(-1, positions, by_rank)

    def attended(self) -> Tensor:
        """``[B, H, Tq, Tk]`` bool at key positions: the keys the core's exact attention
        used (its top-k of the estimate, decompressed; True = attended)."""
        return attended_keys(self.ranking, self.lengths, self.k, self.n_keys, group=self.group,
                             rank_to_pos=self.rank_to_pos)

    def key_importance(self) -> Tensor:
        """``[B, Tk]``: the estimated attention each key receives, averaged over heads and
        summed over the query rows (a token-importance score; sums to the rows' count)."""
        return self.dense().mean(1).sum(1)


@contextlib.contextmanager
def record_estimates(model: nn.Module) -> Iterator[list[SEAEstimate]]:
    """Collect the estimates of every SEA core in ``model`` during the block (see the module
    docstring); the cores record nothing outside it."""
    from attnlab.layers.sea.core import SEACore

    require_type("model", model, nn.Module, "a model (torch.nn.Module) holding SEA cores")
    cores = [m for m in model.modules() if isinstance(m, SEACore)]
    if not cores:
        raise ValueError("the model has no sea attention core to read estimates from")
    estimates: list[SEAEstimate] = []
    for core in cores:
        core.estimate_sink = estimates
    try:
        yield estimates
    finally:
        for core in cores:
            core.estimate_sink = None
