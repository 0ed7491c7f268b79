"""Per-page key summaries that page selectors score, and a scorer's features kept per page.

A page holds ``page`` consecutive real keys (counted by rank among the real keys, so left
padding does not move the pages). Its summary is the elementwise sum, minimum and maximum of
its keys and their count: Quest reads (min, max), block top-k the mean, SEA's page estimator
all three. :func:`summarize` builds the summaries of a whole key tensor,
:func:`summarize_pages` those of some pages from their keys (:func:`summarize_span`, of
consecutive pages where no key is padding); :class:`PageFeatures` keeps a
scorer's features of every page for a decoding state and refreshes a page's once it is
complete (O(page) work every ``page`` tokens, whatever the context).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor


@dataclasses.dataclass
class PageSummary:
    """Summaries of ``P`` pages per KV head: ``total``, ``low``, ``high`` ``[B, Hk, P, D]``
    (sum, elementwise min and max; +inf / -inf for a page with no key) and ``count``
    ``[B, 1, P, 1]`` (keys in the page)."""

    total: Tensor
    low: Tensor
    high: Tensor
    count: Tensor

    def mean(self) -> Tensor:
        """``[B, Hk, P, D]``: each page's mean key (0 for a page with no key)."""
        return self.total / self.count.clamp_min(1.0)

    def bounds(self) -> tuple[Tensor, Tensor]:
        """(min, max) ``[B, Hk, P, D]``, 0 for a page with no key."""
        return tuple(s.nan_to_num(0.0, posinf=0.0, neginf=0.0) for s in (self.low, self.high))


def summarize(k: Tensor, pages: Tensor, n_pages: int) -> PageSummary:
    """Summaries of the pages of k ``[B, Hk, Tk, D]``; pages ``[B, Tk]``: each key's page,
    -1 for padding."""
    b, h_kv, _, d = k.shape
    shape = (b, h_kv, n_pages, d)
    real = (pages >= 0)[:, None, :, None]
    at = pages.clamp_min(0)[:, None, :, None]
    index = at.expand_as(k)
    return PageSummary(
        k.new_zeros(shape).scatter_add(2, index, k * real),
        k.new_full(shape, float("inf")).scatter_reduce(
            2, index, k.masked_fill(~real, float("inf")), "amin"),
        k.new_full(shape, float("-inf")).scatter_reduce(
            2, index, k.masked_fill(~real, float("-inf")), "amax"),
        k.new_zeros(b, 1, n_pages, 1).scatter_add(2, at, real.to(k.dtype)),
    )


def summarize_pages(k: Tensor, index: Tensor, page: int, n_real: Tensor,
                    rank_to_pos: Tensor | None, dtype: torch.dtype | None = None
                    ) -> PageSummary:
    """Summaries ``[B, Hk, m, .]`` of pages ``index`` ``[B, m]`` of each batch row, read from
    their keys in k ``[B, Hk, Tk, D]`` (cast to ``dtype``, None: k's): page p holds ranks
    ``p * page ...`` below ``n_real`` ``[B]``, at positions ``rank_to_pos`` ``[B, Tk]``
    (None: rank = position)."""
    b, h_kv, t_k, d = k.shape
    m = index.shape[1]
    ranks = (index[:, :, None] * page + torch.arange(page, device=k.device)).flatten(1)
    real = ranks < n_real[:, None]
    at = ranks.clamp_max(t_k - 1)
    if rank_to_pos is not None:
        at = rank_to_pos.gather(1, at)
    keys = k.gather(2, at[:, None, :, None].expand(b, h_kv, m * page, d))
    local = torch.arange(m, device=k.device).repeat_interleave(page).expand(b, -1)
    return summarize(keys if dtype is None else keys.to(dtype), torch.where(real, local, -1), m)


def summarize_span(k: Tensor, first: int, m: int, page: int, dtype: torch.dtype | None = None
                   ) -> PageSummary:
    """:func:`summarize_pages` of the ``m`` full pages from page ``first`` when every key of
    k ``[B, Hk, Tk, D]`` is real (rank = position): a slice of the keys reduced in place,
    a handful of ops instead of gathers and scatters (a decoding step without padding)."""
    b, h_kv, t_k, d = k.shape
    if first < 0 or m < 1 or (first + m) * page > t_k:
        raise ValueError(f"pages {first}..{first + m - 1} of {page} keys are not all within "
                         f"the {t_k} keys")
    keys = k[:, :, first * page:(first + m) * page]
    keys = (keys if dtype is None else keys.to(dtype)).reshape(b, h_kv, m, page, d)
    return PageSummary(keys.sum(3), keys.amin(3), keys.amax(3),
                       keys.new_full((b, 1, m, 1), float(page)))


SPARE_PAGES = 64
"""Room a :class:`PageFeatures` reserves beyond its first pages (1024 tokens at pages of
16); past it the room doubles."""


class PageFeatures:
    """A scorer's features of each page (``featurize``: a function of a
    :class:`PageSummary` to ``[B, ., P, F]``, each page's from its own summary), kept in
    room (:data:`SPARE_PAGES` more, then doubling) in their dtype; pages refreshed later are
    summarised from their keys in at least float32, then kept in that dtype. A decoding
    state refreshes a page's features when the page is complete: a page is scored only as a
    candidate, before the query's own page, so the features of a page still filling are
    never read."""

    def __init__(self, features: Tensor, featurize: Callable[[PageSummary], Tensor]) -> None:
        """Start from the features ``[B, ., P, F]`` of the first ``P`` pages."""
        self.featurize, self.dtype = featurize, features.dtype
        n_pages = features.shape[2]
        self._room = features.new_zeros(*features.shape[:2], n_pages + SPARE_PAGES,
                                         features.shape[-1])
        self._room[:, :, :n_pages] = features
        self.n_pages = n_pages

    @property
    def features(self) -> Tensor:
        """``[B, ., P, F]`` (a view)."""
        return self._room[:, :, :self.n_pages]

    def cover(self, n_pages: int) -> None:
        """Hold at least ``n_pages`` pages (the new ones' features 0 until refreshed)."""
        room = self._room.shape[2]
        if n_pages > room:
            grown = self._room.new_zeros(*self._room.shape[:2], 2 * n_pages,
                                         self._room.shape[-1])
            grown[:, :, :room] = self._room
            self._room = grown
        self.n_pages = max(self.n_pages, n_pages)

    def refresh(self, k: Tensor, index: Tensor, page: int, n_real: Tensor,
                rank_to_pos: Tensor | None) -> None:
        """(Re)compute the features of pages ``index`` ``[B, m]`` (held: :meth:`cover`) from
        their keys (:func:`summarize_pages`)."""
        compute = torch.promote_types(self.dtype, torch.float32)
        features = self.featurize(summarize_pages(k, index, page, n_real, rank_to_pos,
                                                  compute)).to(self.dtype)
        at = index[:, None, :, None].expand(*features.shape[:2], -1, features.shape[-1])
        self._room.scatter_(2, at, features)

    def refresh_span(self, k: Tensor, first: int, m: int, page: int) -> None:
        """:meth:`refresh` of the pages ``first ... first + m - 1`` of every row when all of
        k's keys are real (:func:`summarize_span`)."""
        compute = torch.promote_types(self.dtype, torch.float32)
        features = self.featurize(summarize_span(k, first, m, page, compute))
        self._room[:, :, first:first + m] = features.to(self.dtype)
