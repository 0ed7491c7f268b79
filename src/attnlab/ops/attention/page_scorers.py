"""How page selectors score pages: features of each page from its summary, then logits.

A scorer turns the pages' summaries (:class:`~attnlab.ops.attention.page_summary.PageSummary`)
into per-page *features* (each page's independently of the others, so a decoding state keeps
them and recomputes only the pages its new keys touch), and a query into page logits from
those features:

* ``quest`` (Quest): features (min, max) of the page's keys; logit = the upper bound of the
  page's largest logit, ``scale * sum_d max(q_d min_d, q_d max_d)``;
* ``mean`` (block top-k): the page's mean key; logit = its logit;
* a learned scorer (e.g. :class:`attnlab.layers.page_estimator.PageEstimator`) implements
  :class:`PageScorer` itself.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from attnlab.ops.attention.masks import expand_kv_heads
from attnlab.ops.attention.page_summary import PageSummary


class PageScorer(Protocol):
    """Page logits of a selector, from features kept per page."""

    def features(self, summary: PageSummary) -> Tensor:
        """``[B, Hk or H, P, F]``: each page's features (a function of its summary only)."""

    def logits(self, q: Tensor, features: Tensor, q_pages: Tensor, scale: float) -> Tensor:
        """q ``[B, H, Tq, D]``, features ``[B, ., P, F]``, q_pages ``[B, Tq]`` (each query's
        own page) -> ``[B, H, Tq, P]``."""

    def page_logit(self, head: int, query: Tensor, keys: Tensor, distance: int,
                   scale: float) -> float:
        """One head's logit of one page (the loop reference's): query ``[D]``, the page's
        keys ``[n, D]``, ``distance`` = the query's page minus this page."""


class QuestScorer:
    """Quest's bound of a page's largest logit from its keys' elementwise min and max."""

    def features(self, summary: PageSummary) -> Tensor:
        return torch.cat(summary.bounds(), dim=-1)

    def logits(self, q: Tensor, features: Tensor, q_pages: Tensor, scale: float) -> Tensor:
        low, high = expand_kv_heads(features, q.shape[1]).chunk(2, dim=-1)
        # sum_d max(q_d min_d, q_d max_d), as two matmuls
        bound = q.clamp_min(0) @ high.transpose(-1, -2) + q.clamp_max(0) @ low.transpose(-1, -2)
        return bound * scale

    def page_logit(self, head: int, query: Tensor, keys: Tensor, distance: int,
                   scale: float) -> float:
        low, high = keys.min(0).values, keys.max(0).values
        return float(torch.maximum(query * low, query * high).sum()) * scale


class MeanScorer:
    """Block top-k (InfLLM / MoBA): the logit of the page's mean key."""

    def features(self, summary: PageSummary) -> Tensor:
        return summary.mean()

    def logits(self, q: Tensor, features: Tensor, q_pages: Tensor, scale: float) -> Tensor:
        return (q @ expand_kv_heads(features, q.shape[1]).transpose(-1, -2)) * scale

    def page_logit(self, head: int, query: Tensor, keys: Tensor, distance: int,
                   scale: float) -> float:
        return float(query @ keys.mean(0)) * scale


SCORERS: dict[str, PageScorer] = {"quest": QuestScorer(), "mean": MeanScorer()}


def scorer_of(scorer: str | PageScorer) -> PageScorer:
    """A built-in scorer by name (:data:`SCORERS`), or ``scorer`` itself."""
    if not isinstance(scorer, str):
        return scorer
    if scorer not in SCORERS:
        raise ValueError(f"scorer must be one of {list(SCORERS)} or a PageScorer, got "
                         f"{scorer!r}")
    return SCORERS[scorer]
