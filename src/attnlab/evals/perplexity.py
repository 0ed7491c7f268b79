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


@torch.no_grad()
def sliding_perplexity(
    logits_fn: LogitsFn, documents: Sequence[Tensor], context: int, stride: int,
    max_tokens: int | None = None, progress: Callable[[int], None] | None = None,
) -> Scored:
    """Score ``documents`` (1-D token id tensors) in sliding windows (module docstring), in
    order, until ``max_tokens`` targets are scored (whole windows: at most ``stride - 1``
    more). ``progress`` is called with the number of targets each window scored."""
    result = Scored()
    for doc in documents:
        windows = sliding_windows(doc.numel(), context, stride)
        if not windows:
            result.skipped += 1
            continue
        result.documents += 1
        for w in windows:
            ids = doc[w.start:w.start + context + 1]
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
            if max_tokens is not None and result.tokens >= max_tokens:
                return result
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
