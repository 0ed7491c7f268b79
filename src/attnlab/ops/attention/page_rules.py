"""The selection rules every page selector shares: which pages a query may read or must
keep, and which the query heads of a KV group keep together (see
:mod:`attnlab.ops.attention.pages`)."""

from __future__ import annotations

import torch
from torch import Tensor


def check_pages(budget: int, page: int, sink_pages: int, local_pages: int) -> None:
    """``ValueError`` unless the budget is a whole number of pages, more than the sink and
    local pages together."""
    if page < 1:
        raise ValueError(f"page must be >= 1 key, got {page}")
    if sink_pages < 0 or local_pages < 1:
        raise ValueError(f"sink_pages must be >= 0 and local_pages >= 1 (the query's own page),"
                         f" got {sink_pages} and {local_pages}")
    if budget % page:
        raise ValueError(f"budget {budget} is not a whole number of pages of {page} keys; "
                         f"give a multiple of {page}, e.g. {max(page, budget // page * page)}")
    if budget // page <= sink_pages + local_pages:
        raise ValueError(f"budget {budget} = {budget // page} pages of {page} leaves none to "
                         f"select beside {sink_pages} sink and {local_pages} local page(s); "
                         f"give at least {(sink_pages + local_pages + 1) * page}")


def select_pages(logits: Tensor, h_kv: int, readable: Tensor, forced: Tensor, n_top: int
                 ) -> Tensor:
    """Per KV head and row, the pages kept ``[B, Hk, Tq, P]`` (bool): the ``forced`` ones
    ``[B, 1, Tq, P]`` and the ``n_top`` best other ``readable`` ones ``[B, 1, Tq, P]`` by the
    group's summed page probabilities (each head's softmax over those candidates: the forced
    pages, the query's own among them, stay out, so keys after the query never weigh in)."""
    b, h, t_q, n_pages = logits.shape
    candidates = readable & ~forced
    probs = torch.softmax(logits.masked_fill(~candidates, float("-inf")), -1).nan_to_num(0.0)
    group = probs.view(b, h_kv, h // h_kv, t_q, n_pages).sum(2)
    ranked = group.masked_fill(~candidates, float("-inf"))
    top = ranked.topk(min(n_top, n_pages), dim=-1)
    chosen = torch.zeros_like(candidates.expand_as(ranked)).scatter_(
        -1, top.indices, top.values > float("-inf"))
    return chosen | (forced & readable)


def page_masks(n_real: Tensor, q_rank: Tensor, n_pages: int, page: int, sink_pages: int,
               local_pages: int, causal: bool) -> tuple[Tensor, Tensor]:
    """``readable`` and ``forced`` pages ``[B, 1, Tq, P]`` for queries of rank ``q_rank``
    ``[B, Tq]`` (-1: a padded query) among ``n_real`` ``[B]`` real keys."""
    index = torch.arange(n_pages, device=n_real.device)
    has_keys = index[None, :] * page < n_real[:, None]  # [B, P]
    own = (q_rank.clamp_min(0) // page)[..., None]  # [B, Tq, 1]
    readable = has_keys[:, None, :] & ((index <= own) if causal else True)
    forced = (index < sink_pages) | ((index <= own) & (index > own - local_pages))
    return readable[:, None], (forced & readable)[:, None]
