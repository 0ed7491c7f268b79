"""What a page core carries between causal decoding calls, and the selection it makes from it.

Without a state, a call scores pages from the summaries of all its keys: O(context) work per
decoded token just to summarise them. :class:`PageState` keeps the scorer's features of
every page (:class:`~attnlab.ops.attention.page_summary.PageFeatures`) and the count of real
keys, so a step counts its own keys (when they complete a page, that page's features are
computed from its keys), scores the pages from the kept features (``H * P * F``
multiply-adds for ``P`` pages) and reads only the selected pages' keys, the scoring,
selection and attention in one native call where it serves
(:func:`~attnlab.ops.attention.page_step.attend_best_pages`). A state made from the same
keys gives the same selection as the full pass (tested).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from attnlab.ops.attention.masks import key_ranks, rank_positions
from attnlab.ops.attention.page_scorers import PageScorer
from attnlab.ops.attention.page_step import attend_best_pages
from attnlab.ops.attention.page_summary import PageFeatures
from attnlab.ops.attention.pages import all_page_features


@dataclasses.dataclass
class PageState:
    """Causal decoding state after ``n_tokens`` key positions: ``pages`` (the scorer's
    features of every page of the real keys; a page's are final once it is complete),
    ``n_real`` ``[B]`` (real keys so far). Updated in place by :func:`step_attention`; a
    state whose ``n_tokens`` differs from the cache's length is not used (the core rebuilds
    it)."""

    pages: PageFeatures
    n_real: Tensor
    n_tokens: int


def start_state(k: Tensor, key_padding_mask: Tensor | None, page: int, scorer: PageScorer
                ) -> PageState:
    """The state after keys k ``[B, Hk, Tk, D]`` (key_padding_mask ``[B, Tk]``, True = real)."""
    b, _, t_k, _ = k.shape
    with torch.no_grad():
        ranks = key_ranks(key_padding_mask, b, t_k, k.device)
        features = all_page_features(k.detach(), ranks, page, scorer)
        return PageState(PageFeatures(features, scorer.features), ranks.max(-1).values + 1,
                         t_k)


def step_attention(state: PageState, q: Tensor, k: Tensor, v: Tensor,
                   key_padding_mask: Tensor | None, *, scale: float, budget: int, page: int,
                   sink_pages: int, local_pages: int, scorer: PageScorer) -> Tensor:
    """Count the new keys (the last ``Tq`` of k ``[B, Hk, Tk, D]``, ``Tk - Tq`` being the
    state's) into ``state``, refreshing the features of the pages they complete; the new
    causal queries q ``[B, H, Tq, D]`` then attend to the pages they select
    (:func:`~attnlab.ops.attention.page_step.attend_best_pages`) -> ``[B, H, Tq, Dv]``."""
    b, _, t_k, _ = k.shape
    t_q = q.shape[-2]
    with torch.no_grad():
        if key_padding_mask is None:
            counts = state.n_real[:, None] + torch.arange(1, t_q + 1, device=k.device)
            q_ranks = counts - 1
            rank_to_pos = None
        else:
            real = key_padding_mask[:, t_k - t_q:]
            counts = state.n_real[:, None] + real.long().cumsum(-1)
            q_ranks = torch.where(real, counts - 1, -1)
            rank_to_pos = rank_positions(key_padding_mask)
        complete_before, complete = state.n_real // page, counts[:, -1] // page
        n_new, n_pages = (int(x) for x in torch.stack(
            ((complete - complete_before).max(), (counts[:, -1] + page - 1).max() // page)))
        state.pages.cover(n_pages)  # up to the queries' own pages
        if n_new > 0:  # the pages completed by the new keys (a row without one: its last)
            index = (complete_before[:, None] + torch.arange(n_new, device=k.device)).minimum(
                (complete - 1).clamp_min(0)[:, None])
            state.pages.refresh(k.detach(), index, page, counts[:, -1], rank_to_pos)
        state.n_real = counts[:, -1]
        state.n_tokens = t_k
    return attend_best_pages(q, k, v, scorer=scorer, features=state.pages.features,
                             q_ranks=q_ranks, n_real=state.n_real, budget=budget, page=page,
                             sink_pages=sink_pages, local_pages=local_pages, causal=True,
                             scale=scale, rank_to_pos=rank_to_pos)
