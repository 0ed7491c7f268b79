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


def start_state(k: Tensor, key_padding_mask: Tensor | None, page: int, scorer: PageScorer,
                dtype: torch.dtype | None = None) -> PageState:
    """The state after keys k ``[B, Hk, Tk, D]`` (key_padding_mask ``[B, Tk]``, True = real),
    its page features kept in ``dtype`` (None: the keys')."""
    b, _, t_k, _ = k.shape
    with torch.no_grad():
        ranks = key_ranks(key_padding_mask, b, t_k, k.device)
        features = all_page_features(k.detach(), ranks, page, scorer, dtype)
        return PageState(PageFeatures(features, scorer.features), ranks.max(-1).values + 1,
                         t_k)


def step_attention(state: PageState, q: Tensor, k: Tensor, v: Tensor,
                   key_padding_mask: Tensor | None, *, scale: float, budget: int, page: int,
                   sink_pages: int, local_pages: int, scorer: PageScorer,
                   executor: str = "auto") -> Tensor:
    """Count the new keys (the last ``Tq`` of k ``[B, Hk, Tk, D]``, ``Tk - Tq`` being the
    state's) into ``state``, refreshing the features of the pages they complete; the new
    causal queries q ``[B, H, Tq, D]`` then attend to the pages they select
    (:func:`~attnlab.ops.attention.page_step.attend_best_pages`, through ``executor``) ->
    ``[B, H, Tq, Dv]``."""
    t_k, t_q = k.shape[2], q.shape[-2]
    with torch.no_grad():
        if key_padding_mask is None:
            q_ranks, rank_to_pos = _count_all_real(state, k, t_q, page), None
        else:
            q_ranks, rank_to_pos = _count_padded(state, k, key_padding_mask, t_q, page)
        state.n_tokens = t_k
    return attend_best_pages(q, k, v, scorer=scorer, features=state.pages.features,
                             q_ranks=q_ranks, n_real=state.n_real, budget=budget, page=page,
                             sink_pages=sink_pages, local_pages=local_pages, causal=True,
                             scale=scale, rank_to_pos=rank_to_pos, executor=executor)


def _count_all_real(state: PageState, k: Tensor, t_q: int, page: int) -> Tensor:
    """:func:`step_attention`'s count when every key is real: the state's real keys are the
    cached ones (``Tk - Tq``, its ``n_tokens``), so the pages to refresh are known without
    reading a tensor (a handful of ops per step instead of a few dozen). Returns the
    queries' ranks ``[B, Tq]``."""
    b, _, t_k, _ = k.shape
    before = t_k - t_q
    first, complete = before // page, t_k // page
    state.pages.cover(-(-t_k // page))
    if complete > first:
        state.pages.refresh_span(k.detach(), first, complete - first, page)
    state.n_real = torch.full((b,), t_k, dtype=torch.long, device=k.device)
    return torch.arange(before, t_k, device=k.device).expand(b, t_q)


def _count_padded(state: PageState, k: Tensor, key_padding_mask: Tensor, t_q: int, page: int
                  ) -> tuple[Tensor, Tensor]:
    """:func:`step_attention`'s count with padding (True = real key in ``key_padding_mask``
    ``[B, Tk]``). Returns (the queries' ranks ``[B, Tq]``, -1 for padding; the map from rank
    to position ``[B, Tk]``)."""
    t_k = k.shape[2]
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
    return q_ranks, rank_to_pos
