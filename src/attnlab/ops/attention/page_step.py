"""A page selector's step from kept page features: score, select and attend in one call.

A decoding state keeps each page's features (:mod:`attnlab.ops.attention.page_scorers`), so
a step needs only the new queries' logits over them, the group's selection
(:func:`~attnlab.ops.attention.page_rules.select_pages`) and the attention over the kept pages.
:func:`attend_best_pages` does all three in one native CPU kernel call where it serves (no
autograd; float32, float64, bfloat16), or in one Triton kernel on a GPU (no host sync), which
removes the hundred-odd small PyTorch ops a step would otherwise dispatch per layer;
otherwise, and as its reference, the same steps in PyTorch
(:func:`attend_best_pages_reference`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.attention.masks import key_pages, key_ranks, rank_positions
from attnlab.ops.attention.page_rules import page_masks, select_pages
from attnlab.ops.attention.page_scorers import SCORERS, PageScorer, scorer_logits
from attnlab.ops.attention.page_summary import summarize
from attnlab.ops.sparse_attention import native
from attnlab.ops.sparse_attention.executors import executor_for
from attnlab.ops.sparse_attention.pages import (
    PageSelection,
    attend_pages,
    pages_from_kept,
    row_limits,
)


def attend_best_pages_reference(
    q: Tensor, k: Tensor, v: Tensor, *, scorer: PageScorer, features: Tensor, q_ranks: Tensor,
    n_real: Tensor, budget: int, page: int, sink_pages: int, local_pages: int, causal: bool,
    scale: float, rank_to_pos: Tensor | None,
) -> Tensor:
    """:func:`attend_best_pages` in PyTorch ops (differentiable in q, k and v)."""
    n_pages = features.shape[2]
    compute = torch.promote_types(features.dtype, torch.float32)  # 16-bit features widened
    logits = scorer_logits(scorer, q.detach().to(compute), features.to(compute),
                           q_ranks.clamp_min(0) // page, scale)
    readable, forced = page_masks(n_real, q_ranks, n_pages, page, sink_pages, local_pages,
                                  causal)
    kept = select_pages(logits, k.shape[1], readable, forced,
                        budget // page - sink_pages - local_pages)
    selection = PageSelection(pages_from_kept(kept, budget // page), page,
                              row_limits(q_ranks, n_real, causal), rank_to_pos)
    return attend_pages(q, k, v, selection, scale=scale)


def attend_best_pages(
    q: Tensor, k: Tensor, v: Tensor, *, scorer: PageScorer, features: Tensor, q_ranks: Tensor,
    n_real: Tensor, budget: int, page: int, sink_pages: int, local_pages: int, causal: bool,
    scale: float, rank_to_pos: Tensor | None, executor: str = "auto",
) -> Tensor:
    """Exact attention of q ``[B, H, Tq, D]`` over the pages its KV group selects among the
    pages of k, v ``[B, Hk, Tk, D]`` (``budget`` keys per query token per KV head: sinks,
    local pages and the best others, as :func:`~attnlab.ops.attention.pages.paged_attention`).

    features ``[B, Hk or H, P, F]``: the pages' features (``scorer.features``); q_ranks
    ``[B, Tq]``: each query's rank among the real keys (-1: a padded query, output 0);
    n_real ``[B]``: real keys; rank_to_pos ``[B, Tk]`` or None (rank = position);
    ``executor``: ``native`` (CPU) or ``triton`` (the GPU's; no gradients): scores,
    selects and attends in one kernel call; ``torch``: PyTorch ops; or
    ``auto`` (:func:`~attnlab.ops.sparse_attention.executors.executor_for` decides; ``flex``
    has no path for a step and means ``auto`` here). Returns ``[B, H, Tq, Dv]``.
    """
    chosen = executor_for("auto" if executor == "flex" else executor, q, k, v,
                          flex_fits=False, triton_fits=True)
    if chosen == "native":
        # the query features in the kernel's compute dtype, as the reference's (a 16-bit
        # model's widened first: its projection is then also 3x faster than in bfloat16)
        query = scorer.query_features(q.to(native.COMPUTE[q.dtype]))
        return native.page_attention_native(
            q, k, v, query, features, scorer.distance_bias(), q_ranks,
            n_real, page=page, sink_pages=sink_pages, local_pages=local_pages,
            n_top=budget // page - sink_pages - local_pages, causal=causal, scale=scale,
            rank_to_pos=rank_to_pos)
    if chosen == "triton":
        from attnlab.ops.sparse_attention.triton_pages import best_pages_kernel

        compute = torch.promote_types(features.dtype, torch.float32)  # as the reference's
        return best_pages_kernel(
            q, k, v, scorer.query_features(q.to(compute)), features, scorer.distance_bias(),
            q_ranks, n_real, page=page, sink_pages=sink_pages, local_pages=local_pages,
            n_top=budget // page - sink_pages - local_pages, causal=causal, scale=scale,
            rank_to_pos=rank_to_pos)
    return attend_best_pages_reference(
        q, k, v, scorer=scorer, features=features, q_ranks=q_ranks, n_real=n_real,
        budget=budget, page=page, sink_pages=sink_pages, local_pages=local_pages,
        causal=causal, scale=scale, rank_to_pos=rank_to_pos)


def step_example(gen: torch.Generator, *, scorer: str = "quest", causal: bool = True,
                 padded: bool = True, t_q: int = 4, t_k: int = 21) -> contract.Example:
    """Batch 2, 6 query heads of 2 KV heads, pages of 3 keys, a budget of 3 pages, the
    pages' features from the keys; padding: a hole, and left padding."""
    qkv = contract.attention_inputs(gen, h=6, t_q=t_q, t_k=t_k)
    padding = contract.padding_mask(2, t_k) if padded else None
    ranks = key_ranks(padding, 2, t_k, None)
    features = SCORERS[scorer].features(summarize(qkv["k"], key_pages(ranks, 3), -(-t_k // 3)))
    return contract.Example(
        {**qkv, "scorer": SCORERS[scorer], "features": features, "q_ranks": ranks[:, -t_q:],
         "n_real": ranks.max(-1).values + 1, "budget": 9, "page": 3, "sink_pages": 1,
         "local_pages": 1, "causal": causal, "scale": 0.4,
         "rank_to_pos": None if padding is None else rank_positions(padding)},
        contract.attention_shape(qkv))


contract.register(contract.OpContract(
    "attend_best_pages", attend_best_pages, attend_best_pages_reference, step_example,
    cases=(
        *contract.grid(scorer=("quest", "mean"), causal=(True, False)),
        *contract.grid(padded=(False,), t_q=(1, 21)),
    ),
    low_precision=contract.FLOAT32_BFLOAT16,
))
