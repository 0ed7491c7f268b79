"""What a page core carries between causal decoding calls, and the selection it makes from it.

Without a state, a call scores pages from the summaries of all its keys: O(context) work per
decoded token just to summarise them. :class:`PageState` keeps the page summaries and the
scorer's features of every page (:class:`~attnlab.ops.attention.page_summary.GrowingSummary`)
and the count of real keys, so a step adds its own keys (the features of the one or two
pages they touch are recomputed), scores the pages from the kept features (``H * P * F``
multiply-adds for ``P`` pages) and reads only the selected pages' keys. A state made from
the same keys gives the same selection as the full pass (tested).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from attnlab.ops.attention.masks import key_ranks, rank_positions
from attnlab.ops.attention.page_scorers import PageScorer
from attnlab.ops.attention.page_summary import GrowingSummary
from attnlab.ops.attention.pages import page_masks, select_pages
from attnlab.ops.sparse_attention.pages import PageSelection, pages_from_kept


@dataclasses.dataclass
class PageState:
    """Causal decoding state after ``n_tokens`` key positions: ``pages`` (summaries and
    features of the pages of its real keys), ``n_real`` ``[B]`` (real keys so far). Updated
    in place by :func:`step_selection`; a state whose ``n_tokens`` differs from the cache's
    length is not used (the core rebuilds it)."""

    pages: GrowingSummary
    n_real: Tensor
    n_tokens: int


def start_state(k: Tensor, key_padding_mask: Tensor | None, page: int, scorer: PageScorer
                ) -> PageState:
    """The state after keys k ``[B, Hk, Tk, D]`` (key_padding_mask ``[B, Tk]``, True = real)."""
    b, _, t_k, _ = k.shape
    with torch.no_grad():
        ranks = key_ranks(key_padding_mask, b, t_k, k.device)
        pages = torch.where(ranks >= 0, ranks // page, -1)
        n_real = ranks.max(-1).values + 1
        n_pages = max(1, -(-int(n_real.max()) // page))
        return PageState(GrowingSummary(k.detach(), pages, n_pages, scorer.features), n_real,
                         t_k)


def step_selection(state: PageState, q: Tensor, k: Tensor, key_padding_mask: Tensor | None,
                   *, scale: float, budget: int, page: int, sink_pages: int, local_pages: int,
                   scorer: PageScorer) -> PageSelection:
    """Add the new keys (the last ``Tq`` of k ``[B, Hk, Tk, D]``, ``Tk - Tq`` being the
    state's) to ``state`` and select the pages of the new causal queries q ``[B, H, Tq, D]``."""
    b, h_kv, t_k, _ = k.shape
    t_q = q.shape[-2]
    with torch.no_grad():
        new = None if key_padding_mask is None else key_padding_mask[:, t_k - t_q:]
        real = torch.ones(b, t_q, dtype=torch.bool, device=k.device) if new is None else new
        counts = state.n_real[:, None] + real.long().cumsum(-1)
        q_ranks = torch.where(real, counts - 1, -1)
        state.pages.extend(k[..., t_k - t_q:, :].detach(),
                           torch.where(q_ranks >= 0, q_ranks // page, -1))
        state.n_real = counts[:, -1]
        state.n_tokens = t_k
        n_pages = state.pages.n_pages
        logits = scorer.logits(q.detach(), state.pages.features, q_ranks.clamp_min(0) // page,
                               scale)
        readable, forced = page_masks(state.n_real, q_ranks, n_pages, page, sink_pages,
                                      local_pages, causal=True)
        kept = select_pages(logits, h_kv, readable, forced,
                            budget // page - sink_pages - local_pages)
        rank_to_pos = None if key_padding_mask is None else rank_positions(key_padding_mask)
        return PageSelection(pages_from_kept(kept, budget // page), page, q_ranks + 1,
                             rank_to_pos)
