"""Sliding-window perplexity: which targets each window scores, and the sums."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.evals.perplexity import (
    check_sliding,
    plan_windows,
    sliding_perplexity,
    sliding_windows,
)


@pytest.mark.parametrize(("n", "context", "stride"),
                         [(9, 8, 1), (20, 8, 4), (21, 8, 4), (100, 16, 5), (17, 16, 15)])
def test_every_late_target_is_scored_once_with_enough_context(n, context, stride):
    seen = []
    for w in sliding_windows(n, context, stride):
        assert 0 <= w.start and w.start + context <= n - 1  # the window's targets exist
        targets = range(w.score_from, w.start + context + 1)
        assert all(context - stride + 1 <= p - w.start <= context for p in targets)
        seen += targets
    assert seen == list(range(context - stride + 1, n))


def test_short_documents_have_no_windows_and_bad_strides_are_refused():
    assert sliding_windows(8, 8, 4) == []
    for context, stride in [(8, 0), (8, 8), (1, 1)]:
        with pytest.raises(ValueError, match="must be"):
            check_sliding(context, stride)


def test_the_sum_is_the_model_s_nll_of_the_scored_targets():
    """A bigram 'model' (logits of row i from token i only): the result must be its NLL of
    exactly the scored targets, each predicted from the token before it."""
    vocab = 11
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))
    docs = [torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n))
            for n in (40, 6, 33)]

    def logits_fn(ids):
        assert ids.shape == (1, 8)  # always a full context
        return table[ids]

    scored = sliding_perplexity(logits_fn, docs, context=8, stride=3)
    expected, count = 0.0, 0
    for doc in (docs[0], docs[2]):
        for p in range(8 - 3 + 1, doc.numel()):
            expected -= F.log_softmax(table[doc[p - 1]], -1)[doc[p]].item()
            count += 1
    assert (scored.tokens, scored.documents, scored.skipped) == (count, 2, 1)
    assert scored.nll == pytest.approx(expected, rel=1e-6)
    assert scored.ppl == pytest.approx(math.exp(expected / count), rel=1e-6)


def test_scoring_stops_after_the_window_that_reaches_max_tokens():
    docs = [torch.zeros(100, dtype=torch.long)]
    scored = sliding_perplexity(lambda ids: torch.zeros(1, ids.shape[1], 3), docs, 8, 4,
                                max_tokens=10)
    assert scored.tokens == 12  # whole windows of 4 targets: the third one passes 10


def test_a_document_cap_spreads_the_sample_over_the_documents_in_order():
    """At most 8 targets (whole windows of 4) from each document, 20 in all: the first two
    windows of each long document, the short one skipped, the last document cut by the
    total."""
    plan = plan_windows([100, 6, 100, 100, 100], context=8, stride=4, max_tokens=20,
                        max_document_tokens=8)
    assert [i for i, _ in plan.windows] == [0, 0, 2, 2, 3]
    assert [w for i, w in plan.windows if i == 2] == sliding_windows(100, 8, 4)[:2]
    assert (plan.documents, plan.skipped) == (3, 1)
    uncapped = plan_windows([100, 6, 100], context=8, stride=4, max_tokens=20)
    assert [i for i, _ in uncapped.windows] == [0] * 5
    docs = [torch.zeros(n, dtype=torch.long) for n in (100, 6, 100, 100, 100)]
    scored = sliding_perplexity(lambda ids: torch.zeros(1, ids.shape[1], 3), docs, 8, 4,
                                max_tokens=20, max_document_tokens=8)
    assert scored.window_tokens == [4] * 5 and (scored.documents, scored.skipped) == (3, 1)


def test_the_paired_ratio_interval_brackets_the_ratio_and_is_exact_for_a_shift():
    from attnlab.evals.perplexity import ratio_interval

    tokens = [10, 20, 30, 40]
    ref = [12.0, 30.0, 31.0, 50.0]
    shifted = [n + 0.1 * t for n, t in zip(ref, tokens, strict=True)]  # +0.1 nats per token
    low, high = ratio_interval(shifted, ref, tokens)
    assert abs(low - math.exp(0.1)) < 1e-12 and abs(high - math.exp(0.1)) < 1e-12
    noisy = [n + d for n, d in zip(ref, [5.0, -2.0, 1.0, 0.0], strict=True)]
    ratio = math.exp((sum(noisy) - sum(ref)) / sum(tokens))
    low, high = ratio_interval(noisy, ref, tokens)
    assert low < ratio < high
    with pytest.raises(ValueError, match="same, non-empty list"):
        ratio_interval([1.0], [1.0, 2.0], [1])
