"""How page selectors score pages: features of each page from its summary, then logits.

A scorer turns the pages' summaries (:class:`~attnlab.ops.attention.page_summary.PageSummary`)
into per-page *features* ``f_p`` (each page's independently of the others, so a decoding state
keeps them and recomputes only the pages its new keys touch) and a query into *query
features* ``g``; a head's page logit is then always (:func:`scorer_logits`)::

    logit(h, p) = scale * g_h . f_p + bias[h, bucket(|own page - p|)]

with an optional per-head table of distance biases. So one kernel scores every scorer:

* ``quest`` (Quest): ``f = (min, max)`` of the page's keys, ``g = (min(q, 0), max(q, 0))``:
  the upper bound of the page's largest logit, ``scale * sum_d max(q_d min_d, q_d max_d)``;
* ``mean`` (block top-k): ``f`` = the page's mean key, ``g = q``;
* a learned scorer (e.g. :class:`attnlab.layers.page_estimator.PageEstimator`) implements
  :class:`PageScorer` itself.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from attnlab.ops.attention.page_summary import PageSummary


class PageScorer(Protocol):
    """Page logits of a selector, from features kept per page (module docstring)."""

    def features(self, summary: PageSummary) -> Tensor:
        """``[B, Hk or H, P, F]``: each page's features (a function of its summary only)."""

    def query_features(self, q: Tensor) -> Tensor:
        """q ``[B, H, Tq, D]`` -> ``[B, H, Tq, F]``."""

    def distance_bias(self) -> Tensor | None:
        """``[H, n_buckets]``: a logit bias by bucket of page distance, or None."""

    def page_logit(self, head: int, query: Tensor, keys: Tensor, distance: int,
                   scale: float) -> float:
        """One head's logit of one page (the loop reference's): query ``[D]``, the page's
        keys ``[n, D]``, ``distance`` = the query's page minus this page."""


def distance_buckets(distance: Tensor, n_buckets: int) -> Tensor:
    """``min(floor(log2(|d| + 1)), n_buckets - 1)`` of page distances (int64, same shape)."""
    return torch.log2(distance.abs().to(torch.float64) + 1).floor().long().clamp_max(n_buckets - 1)


def scorer_logits(scorer: PageScorer, q: Tensor, features: Tensor, q_pages: Tensor,
                  scale: float) -> Tensor:
    """Page logits ``[B, H, Tq, P]`` of q ``[B, H, Tq, D]`` from page features
    ``[B, Hk or H, P, F]``; q_pages ``[B, Tq]``: each query's own page."""
    b, h, t_q, _ = q.shape
    h_f, n_pages, width = features.shape[1:]
    query = scorer.query_features(q)
    if h_f == h:
        logits = query @ features.transpose(-1, -2)
    else:  # a KV head's features serve its group's query heads
        grouped = query.reshape(b, h_f, h // h_f * t_q, width)
        logits = (grouped @ features.transpose(-1, -2)).view(b, h, t_q, n_pages)
    logits = logits * scale
    bias = scorer.distance_bias()
    if bias is None:
        return logits
    distance = q_pages[:, :, None] - torch.arange(n_pages, device=q.device)
    return logits + bias.to(q.dtype)[:, distance_buckets(distance, bias.shape[1])].transpose(0, 1)


class QuestScorer:
    """Quest's bound of a page's largest logit from its keys' elementwise min and max."""

    def features(self, summary: PageSummary) -> Tensor:
        return torch.cat(summary.bounds(), dim=-1)

    def query_features(self, q: Tensor) -> Tensor:
        return torch.cat((q.clamp_max(0), q.clamp_min(0)), dim=-1)  # times (min, max)

    def distance_bias(self) -> None:
        return None

    def page_logit(self, head: int, query: Tensor, keys: Tensor, distance: int,
                   scale: float) -> float:
        low, high = keys.min(0).values, keys.max(0).values
        return float(torch.maximum(query * low, query * high).sum()) * scale


class MeanScorer:
    """Block top-k (InfLLM / MoBA): the logit of the page's mean key."""

    def features(self, summary: PageSummary) -> Tensor:
        return summary.mean()

    def query_features(self, q: Tensor) -> Tensor:
        return q

    def distance_bias(self) -> None:
        return None

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
