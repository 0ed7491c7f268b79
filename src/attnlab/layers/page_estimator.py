"""SEA's estimate with bins of a fixed number of keys: a learned page scorer.

SEA compresses each row of the attention matrix into ``K`` bins stretched over the row's
keys, so at ``T`` keys a bin holds ``T / K`` of them and the resolution falls as the context
grows (at 8k and ``K = 64`` a head's budget of 256 keys buys two bins). Here the bins are
pages of ``page`` keys counted from the first real key: the compressed row has one cell per
page, as many as the context needs, and a cell's estimate is computed from the query and
the page's pooled keys, so a head's selection keeps its resolution at every length.

Per query head ``h`` and page ``p`` seen from a query in page ``o``::

    logit = scale * (q W_q[h]) . ([mean_p, min_p, max_p] W_k[h]) + bias[h, bucket(o - p)]

``mean_p``, ``min_p``, ``max_p``: the elementwise mean, minimum and maximum of the page's
keys (the summaries of block top-k and Quest, as SeerAttention pools them), ``bucket(d)`` =
``min(floor(log2(d + 1)), n_buckets - 1)`` of the distance in pages (its absolute value for
a bidirectional layer). ``W_q[h]`` starts at the identity and ``W_k[h]`` at ``[I, 0, 0]``, so
an untrained estimator scores pages exactly as block top-k's mean key does; distillation
(:mod:`attnlab.distill.frozen`) fits it to the model's own attention. The queries and keys
arrive rotated (RoPE), so no position table is needed: the bias adds a recency prior that
works at any length.

A decode step scores ``P = T / page`` pages: ``H * W * (D + P)`` multiply-adds once the
pages' projected keys are kept (:func:`decode_macs`), against ``H * T * D`` for the scores of
dense attention.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.ops.attention.masks import expand_kv_heads
from attnlab.ops.attention.page_scorers import distance_buckets, scorer_logits
from attnlab.ops.attention.page_summary import PageSummary, summarize

SUMMARIES = 3  # mean, min, max


def page_summaries(k: Tensor, pages: Tensor, n_pages: int) -> Tensor:
    """k ``[B, Hk, Tk, D]``, pages ``[B, Tk]`` (-1: padding) -> ``[B, Hk, P, 3D]``: each
    page's mean, min and max key (0 for a page with no key)."""
    return stacked(summarize(k, pages, n_pages))


def stacked(summary: PageSummary) -> Tensor:
    """``[B, Hk, P, 3D]``: the mean, min and max of each page of ``summary``."""
    return torch.cat((summary.mean(), *summary.bounds()), dim=-1)


def decode_macs(n_heads: int, d_head: int, width: int, n_keys: int, page: int) -> int:
    """Multiply-adds per decoded token and layer of the page scores (projected page keys
    kept): the query's projection and one dot product per page and head."""
    return n_heads * width * (d_head + math.ceil(n_keys / page))


class PageEstimator(nn.Module):
    """The learned page scorer (module docstring); a
    :class:`~attnlab.ops.attention.pages.PageScorer`. Parameters: ``query`` ``[H, D, W]``,
    ``key`` ``[H, 3D, W]``, ``distance`` ``[H, n_buckets]``."""

    def __init__(self, n_heads: int, d_head: int, width: int, n_buckets: int,
                 causal: bool = True) -> None:
        super().__init__()
        self.causal = causal
        eye = torch.eye(d_head, width)
        self.query = nn.Parameter(eye.expand(n_heads, d_head, width).clone())
        key = torch.zeros(n_heads, SUMMARIES * d_head, width)
        key[:, :d_head] = eye
        self.key = nn.Parameter(key)
        self.distance = nn.Parameter(torch.zeros(n_heads, n_buckets))

    def extra_repr(self) -> str:
        h, d, w = self.query.shape
        return f"heads={h}, d_head={d}, width={w}, buckets={self.distance.shape[1]}"

    def project(self, summary: Tensor) -> Tensor:
        """summary ``[B, Hk, P, 3D]`` (:func:`page_summaries`) -> each head's projected page
        keys ``[B, H, P, W]``."""
        h = self.query.shape[0]
        return torch.einsum("bhpe,hew->bhpw", expand_kv_heads(summary, h),
                            self.key.to(summary.dtype))

    def features(self, summary: PageSummary) -> Tensor:
        """The :class:`~attnlab.ops.attention.page_scorers.PageScorer` page features: the
        projected page keys ``[B, H, P, W]``."""
        return self.project(stacked(summary))

    def query_features(self, q: Tensor) -> Tensor:
        """The projected queries ``[B, H, Tq, W]`` of q ``[B, H, Tq, D]``."""
        return torch.matmul(q, self.query.to(q.dtype))  # one batched matmul: half einsum's time

    def distance_bias(self) -> Tensor:
        """``[H, n_buckets]``: the recency prior by bucket of page distance."""
        return self.distance

    def logits_from_summaries(self, q: Tensor, summary: Tensor, q_pages: Tensor,
                              scale: float) -> Tensor:
        """q ``[B, H, Tq, D]``, summary ``[B, Hk, P, 3D]`` (:func:`page_summaries`), q_pages
        ``[B, Tq]`` -> logits ``[B, H, Tq, P]`` (differentiable in the parameters)."""
        return scorer_logits(self, q, self.project(summary.to(q.dtype)), q_pages, scale)

    def forward(self, q: Tensor, k: Tensor, pages: Tensor, n_pages: int, q_pages: Tensor,
                scale: float) -> Tensor:
        """Page logits ``[B, H, Tq, P]`` of q ``[B, H, Tq, D]`` over the pages ``[B, Tk]``
        (-1: padding) of k ``[B, Hk, Tk, D]``."""
        return self.logits_from_summaries(q, page_summaries(k, pages, n_pages), q_pages, scale)

    def page_logit(self, head: int, query: Tensor, keys: Tensor, distance: int,
                   scale: float) -> float:
        """One head's logit of one page from its keys ``[n, D]`` (the naive reference)."""
        with torch.no_grad():
            summary = torch.cat((keys.mean(0), keys.min(0).values, keys.max(0).values))
            w_q, w_k = self.query[head].to(query.dtype), self.key[head].to(query.dtype)
            bucket = distance_buckets(torch.tensor(distance), self.distance.shape[1])
            bias = float(self.distance[head, bucket])
            return float((query @ w_q) @ (summary @ w_k)) * scale + bias
