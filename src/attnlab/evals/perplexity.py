"""Perplexity at a long context: sliding windows over whole held-out documents.

A window feeds ``context`` tokens ``[start, start + context)`` to the model, which predicts
the tokens ``start + 1 .. start + context``. Windows start every ``stride`` tokens (the last
one moved back to end at the document's end) and score only the targets no earlier window
scored, and never one with fewer than ``context - stride + 1`` tokens before it in its
window: every scored token is predicted from between ``context - stride + 1`` and
``context`` tokens of its own document, so the figure is the model's quality *at* that
context, not an average dominated by short prefixes. The first ``context - stride + 1``
tokens of a document are never targets; a document of ``context`` tokens or fewer is skipped
and counted (:class:`Scored` ``skipped``).

A sample of ``max_tokens`` targets takes whole windows in document order; with
``max_document_tokens`` it takes at most that many targets from each document, so that it
spans several documents instead of the first one's windows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Window:
    """Feeds tokens ``[start, start + context)``; scores the targets (positions of predicted
    tokens) ``score_from .. start + context``."""

    start: int
    score_from: int

    def targets(self, context: int) -> int:
        """How many targets the window scores."""
        return self.start + context - self.score_from + 1


def check_sliding(context: int, stride: int) -> None:
    """``ValueError`` unless ``1 <= stride <= context - 1``."""
    if context < 2:
        raise ValueError(f"context must be >= 2 tokens, got {context}")
    if not 1 <= stride < context:
        raise ValueError(f"stride must be between 1 and context - 1 = {context - 1} tokens, "
                         f"got {stride}")


def sliding_windows(n_tokens: int, context: int, stride: int) -> list[Window]:
    """The windows of a document of ``n_tokens`` tokens (none when ``n_tokens <= context``),
    as the module docstring says."""
    check_sliding(context, stride)
    if n_tokens <= context:
        return []
    last_start = n_tokens - 1 - context
    windows, scored_to, start = [], context - stride, 0
    while scored_to < n_tokens - 1:
        start = min(start, last_start)
        windows.append(Window(start, scored_to + 1))
        scored_to = start + context
        start += stride
    return windows


@dataclasses.dataclass
class Scored:
    """Summed negative log-likelihood (nats) over ``tokens`` targets of ``documents``, and
    each window's (``window_nll``, ``window_tokens``), the units a bootstrap resamples."""

    nll: float = 0.0
    tokens: int = 0
    documents: int = 0
    skipped: int = 0
    window_nll: list[float] = dataclasses.field(default_factory=list)
    window_tokens: list[int] = dataclasses.field(default_factory=list)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.tokens) if self.tokens else math.nan


LogitsFn = Callable[[Tensor], Tensor]
"""``[1, T]`` token ids -> ``[1, T, vocab]`` logits (a causal language model's forward)."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """The windows a sample scores, as ``(document index, window)`` in scoring order, the
    documents they come from and the documents skipped as too short on the way."""

    windows: list[tuple[int, Window]]
    documents: int
    skipped: int


def plan_windows(lengths: Sequence[int], context: int, stride: int,
                 max_tokens: int | None = None,
                 max_document_tokens: int | None = None) -> Plan:
    """The windows of documents of ``lengths`` tokens, in order, until ``max_tokens``
    targets (whole windows: at most ``stride - 1`` more), taking at most
    ``max_document_tokens`` targets (whole windows) from each document."""
    chosen: list[tuple[int, Window]] = []
    documents = skipped = tokens = 0
    for index, n_tokens in enumerate(lengths):
        if max_tokens is not None and tokens >= max_tokens:
            break
        windows = sliding_windows(n_tokens, context, stride)
        if not windows:
            skipped += 1
            continue
        documents += 1
        in_document = 0
        for w in windows:
            chosen.append((index, w))
            in_document += w.targets(context)
            tokens += w.targets(context)
            if max_tokens is not None and tokens >= max_tokens:
                break
            if max_document_tokens is not None and in_document >= max_document_tokens:
                break
    return Plan(chosen, documents, skipped)


@torch.no_grad()
def sliding_perplexity(
    logits_fn: LogitsFn, documents: Sequence[Tensor], context: int, stride: int,
    max_tokens: int | None = None, progress: Callable[[int], None] | None = None,
    max_document_tokens: int | None = None,
) -> Scored:
    """Score ``documents`` (1-D token id tensors) in the windows of :func:`plan_windows`.
    ``progress`` is called with the number of targets each window scored."""
    plan = plan_windows([d.numel() for d in documents], context, stride, max_tokens,
                        max_document_tokens)
    result = Scored(documents=plan.documents, skipped=plan.skipped)
    for index, w in plan.windows:
        ids = documents[index][w.start:w.start + context + 1]
        logits = logits_fn(ids[None, :-1])[0]
        first = w.score_from - w.start - 1  # logits row predicting token score_from
        targets = ids[first + 1:]
        nll = F.cross_entropy(logits[first:].float(), targets, reduction="sum").item()
        result.nll += nll
        result.tokens += targets.numel()
        result.window_nll.append(nll)
        result.window_tokens.append(targets.numel())
        if progress is not None:
            progress(targets.numel())
    return result


def ratio_interval(nll: Sequence[float], ref_nll: Sequence[float], tokens: Sequence[int],
                   samples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% paired bootstrap interval of ``ppl / ref_ppl`` over windows: both models scored
    the same windows (``tokens`` targets each); windows are resampled with replacement."""
    if not len(nll) == len(ref_nll) == len(tokens) or not tokens:
        raise ValueError("a paired interval needs the same, non-empty list of windows")
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(tokens), (samples, len(tokens)), generator=gen)
    diff = torch.tensor(nll, dtype=torch.float64) - torch.tensor(ref_nll, dtype=torch.float64)
    count = torch.tensor(tokens, dtype=torch.float64)
    ratios = torch.exp(diff[pick].sum(-1) / count[pick].sum(-1))
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975], dtype=torch.float64))
    return float(low), float(high)
