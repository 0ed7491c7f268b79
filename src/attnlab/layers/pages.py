"""``quest``, ``block`` and ``sea_pages`` cores: selection of pages of keys per KV head.

``quest`` (Quest) scores each page of 16 keys by the upper bound of its largest logit from
the elementwise minimum and maximum of its keys; ``block`` (block top-k, as InfLLM / MoBA)
scores pages of 64 keys by their mean key; ``sea_pages`` scores pages of 16 keys with a
distilled estimator (:mod:`attnlab.layers.page_estimator`: SEA's estimate with bins of a
fixed number of keys), loaded from an estimators file. All keep ``budget`` keys per query
token per KV head (the query heads of a GQA group read the same keys): the first
``sink_pages`` pages, the query's own page and the ``local_pages - 1`` before it, and the
best other pages, then exact softmax over them
(:func:`attnlab.ops.attention.pages.paged_attention`). Layers below ``dense_layers`` attend
to every key (Quest keeps its first two layers dense).

The selection scores every page (O(T / page) per query); at inference one native CPU call
per layer scores, selects and attends (:mod:`attnlab.ops.attention.page_step`; on a GPU one
Triton kernel per decoding step, and FlexAttention for a prefill). Causal decoding in eval
mode carries a :class:`~attnlab.layers.page_state.PageState` (the scorer's
features of every page, a page's computed once it is complete), so a step costs its page
scores and the keys it keeps. Pages are counted over the real keys, so padding does not move
them, and a cached step equals the full pass; without a usable state (the first call, a
cache filled elsewhere) the core selects from the cached keys and starts one, exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from attnlab.config import ConfigError
from attnlab.layers.base import AttentionCore, CoreOutput, LayerContext
from attnlab.layers.bias import ScoreBias
from attnlab.layers.estimator_file import layer_estimator, resolve
from attnlab.layers.page_estimator import PageEstimator
from attnlab.layers.page_state import PageState, start_state, step_attention
from attnlab.layers.registry import CORES
from attnlab.ops.attention import softmax_attention
from attnlab.ops.attention.page_rules import check_pages
from attnlab.ops.attention.page_scorers import PageScorer, scorer_of
from attnlab.ops.attention.pages import paged_attention
from attnlab.ops.sparse_attention.executors import check_executor
from attnlab.utils.threads import single_threaded

FEATURE_DTYPES = {"keys": None, "bfloat16": torch.bfloat16}
"""``feature_dtype`` options: the dtype a decoding state keeps the page features in (None:
the keys')."""

ONE_THREAD_ROWS = 2
"""Query rows (batch x new tokens) up to which a decoding step runs on one thread. Measured on
SmolLM2-135M at 8k (docs/results/serve-sea-pages-cpu): at batch 1 one thread loses nothing
measurable when the machine is quiet, and keeps its quiet decode rate (84-115% in two runs)
while another process holds a core (two threads: 34-42%); at batch 8 one thread cost about
30% of the quiet decode rate (the kernel's 24 (row, KV head) items are worth two threads)."""


@dataclasses.dataclass(frozen=True)
class PageOptions:
    """``budget``: keys read per query token per KV head (a multiple of ``page``);
    ``page``: keys per page; ``sink_pages`` / ``local_pages``: pages always kept at the start
    and up to the query; ``dense_layers``: this many first layers attend to every key;
    ``executor``: what computes the attention over the selection (``auto``, ``native``,
    ``flex``, ``triton``, ``torch``: :mod:`attnlab.ops.sparse_attention.executors`; a
    decoding step with a state runs ``auto``'s choice for ``flex``, which has no step:
    ``native`` on CPU, ``triton`` on a GPU); ``feature_dtype``: what a
    causal decoding state keeps the page features in (:data:`FEATURE_DTYPES`): ``keys``
    (their dtype) or ``bfloat16`` (beside float32 keys half the state's memory and half the
    bytes a step scores; the full pass that starts the state reads the same rounded
    features, so decoding still equals it)."""

    budget: int = 256
    page: int = 16
    sink_pages: int = 1
    local_pages: int = 1
    dense_layers: int = 0
    executor: str = "auto"
    feature_dtype: str = "keys"

    def validate(self) -> None:
        check_pages(self.budget, self.page, self.sink_pages, self.local_pages)
        check_executor(self.executor)
        if self.feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype {self.feature_dtype!r} is not valid; valid: "
                             f"{', '.join(FEATURE_DTYPES)}")
        if self.dense_layers < 0:
            raise ValueError(f"dense_layers must be >= 0, got {self.dense_layers}")


@dataclasses.dataclass(frozen=True)
class BlockOptions(PageOptions):
    """As :class:`PageOptions`, with InfLLM / MoBA's larger blocks."""

    page: int = 64


@dataclasses.dataclass(frozen=True)
class EstimatedPageOptions(PageOptions):
    """As :class:`PageOptions`, plus the estimator's: ``estimators``, a shipped set's name
    (:func:`attnlab.layers.estimator_file.shipped`) or the path of an estimators file (None:
    the untrained estimator, which scores as block top-k at this page size); ``width`` and
    ``distance_buckets`` its sizes (:class:`~attnlab.layers.page_estimator.PageEstimator`),
    which must match the file's."""

    estimators: str | None = None
    width: int = 64
    distance_buckets: int = 12

    def validate(self) -> None:
        super().validate()
        if self.width < 1 or self.distance_buckets < 1:
            raise ValueError(f"width and distance_buckets must be >= 1, got {self.width} and "
                             f"{self.distance_buckets}")
        if self.estimators is not None:
            resolve(self.estimators)  # a missing file is named before any work


class PageCore(AttentionCore):
    """Exact softmax over the pages each row keeps per KV head, scored by ``scorer`` (a
    built-in scorer's name, or a learned :class:`PageScorer` module, then a submodule)."""

    exact_restart = True  # a state holds the features of the cached keys' pages, no more

    def __init__(self, options: PageOptions, scorer: str | PageScorer, causal: bool,
                 dense: bool) -> None:
        super().__init__()
        self.options, self.scorer, self.causal, self.dense = options, scorer, causal, dense

    def extra_repr(self) -> str:
        o = self.options
        scorer = self.scorer if isinstance(self.scorer, str) else "learned"
        return (f"scorer={scorer!r}, budget={o.budget}, page={o.page}, "
                f"sink_pages={o.sink_pages}, local_pages={o.local_pages}, dense={self.dense}, "
                f"executor={o.executor!r}, feature_dtype={o.feature_dtype!r}")

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float,
        key_padding_mask: Tensor | None = None,
        score_bias: ScoreBias | None = None,
        state: Any = None,
    ) -> CoreOutput:
        """q ``[B, H, Tq, D]`` (the last ``Tq`` of the keys), k, v ``[B, Hk, Tk, D]`` ->
        ``[B, H, Tq, D]``; ``key_padding_mask`` ``[B, Tk]``, True = real key."""
        bias = None if score_bias is None else score_bias.dense()
        if self.dense:
            return CoreOutput(softmax_attention(q, k, v, scale=scale, causal=self.causal,
                                                key_padding_mask=key_padding_mask,
                                                score_bias=bias))
        o = self.options
        scorer = scorer_of(self.scorer)
        stateful = self.causal and not self.training and bias is None
        n_cached = k.shape[-2] - q.shape[-2]
        if stateful and isinstance(state, PageState) and state.n_tokens == n_cached:
            with single_threaded(q.shape[0] * q.shape[2] <= ONE_THREAD_ROWS):
                out = step_attention(
                    state, q, k, v, key_padding_mask, scale=scale, budget=o.budget,
                    page=o.page, sink_pages=o.sink_pages, local_pages=o.local_pages,
                    scorer=scorer, executor=o.executor)
            return CoreOutput(out, state=state)
        state = (start_state(k, key_padding_mask, o.page, scorer,
                             FEATURE_DTYPES[o.feature_dtype]) if stateful else None)
        out = paged_attention(
            q, k, v, scale=scale, budget=o.budget, page=o.page, scorer=scorer,
            sink_pages=o.sink_pages, local_pages=o.local_pages, causal=self.causal,
            key_padding_mask=key_padding_mask, score_bias=bias,
            features=None if state is None else state.pages.features, executor=o.executor)
        return CoreOutput(out, state=state)


def _build(ctx: LayerContext, options: PageOptions, scorer: str | PageScorer) -> PageCore:
    if options.dense_layers > ctx.n_layers:
        raise ConfigError(f"dense_layers={options.dense_layers} exceeds the model's "
                          f"{ctx.n_layers} layers")
    return PageCore(options, scorer, ctx.causal, dense=ctx.layer_idx < options.dense_layers)


@CORES.register("quest", PageOptions, score_bias=True, budget=("budget",), marker="v")
def _quest(ctx: LayerContext, options: PageOptions, dropout: float) -> PageCore:
    """Quest: pages of keys scored by their min/max bound, the best kept per KV head."""
    return _build(ctx, options, "quest")


@CORES.register("block", BlockOptions, score_bias=True, budget=("budget",), marker="P")
def _block(ctx: LayerContext, options: BlockOptions, dropout: float) -> PageCore:
    """Block top-k (InfLLM / MoBA): key blocks scored by their mean key, kept per KV head."""
    return _build(ctx, options, "mean")


@CORES.register("sea_pages", EstimatedPageOptions, score_bias=True, approximate=True,
                budget=("budget",), weights_option="estimators", marker="h")
def _sea_pages(ctx: LayerContext, options: EstimatedPageOptions, dropout: float) -> PageCore:
    """SEA with fixed-size bins: pages scored by a distilled estimator, kept per KV head."""
    estimator = PageEstimator(ctx.n_heads, ctx.d_head, options.width, options.distance_buckets,
                              causal=ctx.causal)
    if options.estimators is not None:
        facts = {"d_model": ctx.d_model, "n_layers": ctx.n_layers, "n_heads": ctx.n_heads,
                 "d_head": ctx.d_head, "page": options.page, "width": options.width,
                 "n_buckets": options.distance_buckets}
        tensors = layer_estimator(options.estimators, ctx.layer_idx, facts)
        with torch.no_grad():
            for name, param in estimator.named_parameters():
                param.copy_(tensors[name])
    return _build(ctx, options, estimator)
