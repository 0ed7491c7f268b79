"""Per-page key summaries that page selectors score, built at once or grown token by token.

A page holds ``page`` consecutive real keys (counted by rank among the real keys, so left
padding does not move the pages). Its summary is the elementwise sum, minimum and maximum of
its keys and their count: Quest reads (min, max), block top-k the mean, SEA's page estimator
all three. :func:`summarize` builds the summaries of a whole key tensor;
:class:`GrowingSummary` keeps them, and a scorer's features of them, for a decoding state, in
reserved room, and updates only the pages its new keys fall in (O(new keys) per step,
whatever the context).
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

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(total, low, high, count), the tensors themselves (``dataclasses.astuple`` would
        copy them)."""
        return self.total, self.low, self.high, self.count

    def mean(self) -> Tensor:
        """``[B, Hk, P, D]``: each page's mean key (0 for a page with no key)."""
        return self.total / self.count.clamp_min(1.0)

    def bounds(self) -> tuple[Tensor, Tensor]:
        """(min, max) ``[B, Hk, P, D]``, 0 for a page with no key."""
        return tuple(s.nan_to_num(0.0, posinf=0.0, neginf=0.0) for s in (self.low, self.high))

    def pages(self, index: Tensor) -> PageSummary:
        """The summaries of pages ``index`` ``[B, m]`` of each batch row (``[B, ., m, .]``)."""
        def pick(x: Tensor) -> Tensor:
            return x.gather(2, index[:, None, :, None].expand(*x.shape[:2], -1, x.shape[-1]))
        return PageSummary(*(pick(x) for x in self.tensors()))

    def prefix(self, n_pages: int) -> PageSummary:
        """The first ``n_pages`` pages (views)."""
        return PageSummary(*(x[:, :, :n_pages] for x in self.tensors()))


def _empty(k: Tensor, b: int, n_pages: int) -> PageSummary:
    h_kv, d = k.shape[1], k.shape[-1]
    shape = (b, h_kv, n_pages, d)
    return PageSummary(k.new_zeros(shape), k.new_full(shape, float("inf")),
                       k.new_full(shape, float("-inf")), k.new_zeros(b, 1, n_pages, 1))


def _add(summary: PageSummary, k: Tensor, pages: Tensor) -> None:
    """Add keys k ``[B, Hk, n, D]`` of pages ``[B, n]`` (-1: padding, skipped) in place."""
    real = (pages >= 0)[:, None, :, None]
    at = pages.clamp_min(0)[:, None, :, None]
    index = at.expand_as(k)
    summary.total.scatter_add_(2, index, k * real)
    summary.low.scatter_reduce_(2, index, k.masked_fill(~real, float("inf")), "amin")
    summary.high.scatter_reduce_(2, index, k.masked_fill(~real, float("-inf")), "amax")
    summary.count.scatter_add_(2, at, real.to(k.dtype))


def summarize(k: Tensor, pages: Tensor, n_pages: int) -> PageSummary:
    """Summaries of the pages of k ``[B, Hk, Tk, D]``; pages ``[B, Tk]``: each key's page,
    -1 for padding."""
    summary = _empty(k, k.shape[0], n_pages)
    _add(summary, k, pages)
    return summary


class GrowingSummary:
    """The page summaries of the keys seen so far and a scorer's features of each page
    (``featurize``: a function of a :class:`PageSummary` to ``[B, ., P, F]``, each page's
    from its own summary), in room that doubles when full.

    :meth:`extend` adds new keys and recomputes the features of the pages they touched
    only; :attr:`summary` and :attr:`features` are views of the pages in use.
    """

    def __init__(self, k: Tensor, pages: Tensor, n_pages: int,
                 featurize: Callable[[PageSummary], Tensor]) -> None:
        """Start from keys k ``[B, Hk, Tk, D]`` of pages ``[B, Tk]`` (-1: padding)."""
        self.featurize = featurize
        room = max(1, 2 * n_pages)
        self._room = _empty(k, k.shape[0], room)
        _add(self._room, k, pages)
        features = featurize(self._room.prefix(n_pages))
        self._features = features.new_zeros(*features.shape[:2], room, features.shape[-1])
        self._features[:, :, :n_pages] = features
        self.n_pages = n_pages

    @property
    def summary(self) -> PageSummary:
        return self._room.prefix(self.n_pages)

    @property
    def features(self) -> Tensor:
        return self._features[:, :, :self.n_pages]

    def _grow(self, k: Tensor, needed: int) -> None:
        room = self._room.count.shape[2]
        if needed <= room:
            return
        grown = _empty(k, k.shape[0], 2 * needed)
        for new, old in zip(grown.tensors(), self._room.tensors(),
                            strict=True):
            new[:, :, :room] = old
        features = self._features.new_zeros(*self._features.shape[:2], 2 * needed,
                                            self._features.shape[-1])
        features[:, :, :room] = self._features
        self._room, self._features = grown, features

    def extend(self, k: Tensor, pages: Tensor) -> None:
        """Add keys k ``[B, Hk, n, D]`` of pages ``[B, n]`` (-1: padding, non-decreasing
        among a row's real keys)."""
        real = pages >= 0
        if not bool(real.any()):
            return
        self._grow(k, int(pages.max()) + 1)
        _add(self._room, k, pages)
        self.n_pages = max(self.n_pages, int(pages.max()) + 1)
        # the pages each row touched: a range from its first to its last new page
        first = pages.masked_fill(~real, torch.iinfo(pages.dtype).max).min(-1).values
        last = pages.max(-1).values
        first = torch.where(last >= 0, first, 0)
        span = int((last - first).max()) + 1
        touched = (first[:, None] + torch.arange(span, device=pages.device)).minimum(
            last.clamp_min(0)[:, None])
        features = self.featurize(self._room.pages(touched))
        index = touched[:, None, :, None].expand(*features.shape[:2], -1, features.shape[-1])
        self._features.scatter_(2, index, features)
