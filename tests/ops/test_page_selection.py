"""The page selection format and its executors, the native route of paged attention, and page
summaries grown token by token, each against its reference."""

from __future__ import annotations

import pytest
import torch

from attnlab.ops.attention.masks import rank_positions
from attnlab.ops.attention.page_scorers import SCORERS
from attnlab.ops.attention.page_step import attend_best_pages, attend_best_pages_reference
from attnlab.ops.attention.page_summary import PageFeatures, summarize
from attnlab.ops.attention.pages import paged_attention, paged_attention_naive
from attnlab.ops.sparse_attention import native
from attnlab.ops.sparse_attention.pages import (
    PageSelection,
    attend_pages,
    attend_pages_naive,
    pages_from_kept,
    selection_keep,
)
from attnlab.utils.testing import assert_close

F64 = torch.float64
B, H, HK, T, D, PAGE, N = 2, 6, 2, 21, 8, 3, 3
PAD = 4  # left padding of the first row
needs_native = pytest.mark.skipif(not native.available(), reason="no C++ compiler")
TOLERANCE = {F64: 1e-13, torch.float32: 1e-6, torch.bfloat16: torch.finfo(torch.bfloat16).eps}


def qkv(dtype=F64, t_q: int = T, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t_q, D, generator=gen, dtype=F64).to(dtype)
    k, v = (torch.randn(B, HK, T, D, generator=gen, dtype=F64).to(dtype) for _ in range(2))
    return q, k, v


def padding_mask() -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :PAD] = False
    return mask


def random_selection(padded: bool, t_q: int = T, seed: int = 1) -> PageSelection:
    """Each row reads N distinct random pages (some slots unused), causally."""
    gen = torch.Generator().manual_seed(seed)
    mask = padding_mask() if padded else torch.ones(B, T, dtype=torch.bool)
    n_pages = -(-T // PAGE)
    scores = torch.rand(B, HK, t_q, n_pages, generator=gen)
    pages = scores.topk(N, -1).indices
    pages = pages.masked_fill(torch.rand(pages.shape, generator=gen) < 0.2, -1)
    q_rank = (mask.long().cumsum(-1) - 1).masked_fill(~mask, -1)[:, T - t_q:]
    return PageSelection(pages, PAGE, q_rank + 1, rank_positions(mask) if padded else None)


def test_pages_from_kept_lists_the_kept_pages_in_order():
    kept = torch.tensor([[[[False, True, False, True, True]]]])
    assert pages_from_kept(kept, 4).tolist() == [[[[1, 3, 4, -1]]]]
    assert pages_from_kept(kept, 7).tolist() == [[[[1, 3, 4, -1, -1, -1, -1]]]]


def test_selection_keep_reads_the_pages_up_to_the_limit_at_real_positions():
    mask = torch.tensor([[False, False, True, True, True, True, True]])
    selection = PageSelection(torch.tensor([[[[0, 2]]]]), 2, torch.tensor([[5]]),
                              rank_positions(mask))
    # ranks 0-1 (page 0) and 4 (page 2 up to rank 4) -> positions 2, 3 and 6
    assert selection_keep(selection, 7)[0, 0, 0].tolist() == [False] * 2 + [True] * 2 + [
        False] * 2 + [True]


@needs_native
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padded", [False, True], ids=["", "padded"])
def test_the_native_executor_matches_the_reference(dtype, padded):
    q, k, v = qkv(dtype)
    assert native.supports(q, k, v)
    selection = random_selection(padded)
    rows = slice(PAD, None) if padded else slice(None)
    ref = attend_pages_naive(*(x.double() for x in (q, k, v)), selection, scale=0.4)
    out = attend_pages(q, k, v, selection, scale=0.4)
    assert out.dtype == dtype
    assert_close("native pages", ref[..., rows, :], out[..., rows, :].double(),
                 TOLERANCE[dtype])


@needs_native
@pytest.mark.parametrize("scorer", ["quest", "mean"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("padded", [False, True], ids=["", "padded"])
def test_paged_attention_without_autograd_takes_the_native_route(monkeypatch, scorer, causal,
                                                                 padded):
    """One native call scores, selects and attends for every row."""
    calls = []
    real = native.page_attention_native
    monkeypatch.setattr(native, "page_attention_native",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = qkv()
    kw = dict(scale=0.35, budget=9, page=PAGE, scorer=scorer, causal=causal,
              key_padding_mask=padding_mask() if padded else None)
    with torch.no_grad():
        out = paged_attention(q, k, v, **kw)
    assert len(calls) == 1
    ref = paged_attention_naive(q, k, v, **kw)
    rows = slice(PAD, None) if padded else slice(None)
    assert_close("native paged attention", ref[..., rows, :], out[..., rows, :], 1e-13)


@pytest.mark.parametrize("scorer", ["quest", "mean"])
def test_features_refreshed_from_each_pages_keys_equal_those_of_all_keys(scorer):
    """Features started from the first 5 keys (padding in front of row 0), then each page
    refreshed from its own keys (read through rank_to_pos), equal the features of all keys."""
    _, k, _ = qkv()
    mask = padding_mask()
    ranks = (mask.long().cumsum(-1) - 1).masked_fill(~mask, -1)
    pages = torch.where(ranks >= 0, ranks // PAGE, -1)
    n_real, n_pages = mask.sum(-1), -(-T // PAGE)
    featurize = SCORERS[scorer].features
    first = int(pages[:, :5].max()) + 1
    kept = PageFeatures(featurize(summarize(k[..., :5, :], pages[:, :5], first)), featurize)
    kept.cover(n_pages)
    last = (n_real - 1) // PAGE
    index = torch.arange(n_pages).expand(B, -1).minimum(last[:, None])  # row 0 has fewer
    kept.refresh(k, index, PAGE, n_real, rank_positions(mask))
    assert kept.n_pages == n_pages
    want = featurize(summarize(k, pages, n_pages))
    for row in range(B):
        held = int(last[row]) + 1
        assert_close(f"row {row}", want[row, :, :held], kept.features[row, :, :held], 1e-14)


@pytest.mark.parametrize("scorer", ["quest", "mean"])
def test_features_refreshed_from_a_span_of_unpadded_pages_equal_those_of_all_keys(scorer):
    """Without padding, pages refreshed from a slice of the keys (:meth:`refresh_span`) hold
    the features of all keys; a span past the keys is refused."""
    _, k, _ = qkv()
    ranks = torch.arange(T).expand(B, T)
    pages = ranks // PAGE
    full = T // PAGE  # the pages every key of which is there
    featurize = SCORERS[scorer].features
    kept = PageFeatures(featurize(summarize(k[..., :PAGE, :], pages[:, :PAGE], 1)), featurize)
    kept.cover(full)
    kept.refresh_span(k, 1, full - 1, PAGE)
    want = featurize(summarize(k, pages, -(-T // PAGE)))[:, :, :full]
    assert_close("span", want, kept.features, 1e-14)
    with pytest.raises(ValueError, match="not all within"):
        kept.refresh_span(k, full, 1, PAGE)


class BiasedScorer:
    """A learned-looking scorer: per-head projections of the query and the page's mean key,
    and a distance bias (as SEA's page estimator)."""

    def __init__(self, width: int = 5, buckets: int = 3) -> None:
        gen = torch.Generator().manual_seed(7)
        self.w_q = torch.randn(H, D, width, generator=gen, dtype=F64) * 0.3
        self.w_k = torch.randn(H, D, width, generator=gen, dtype=F64) * 0.3
        self.bias = torch.randn(H, buckets, generator=gen, dtype=F64)

    def features(self, summary):
        mean = summary.mean().repeat_interleave(H // HK, dim=1)
        return torch.einsum("bhpd,hdw->bhpw", mean, self.w_k.to(mean.dtype))

    def query_features(self, q):
        return torch.einsum("bhtd,hdw->bhtw", q, self.w_q.to(q.dtype))

    def distance_bias(self):
        return self.bias


@needs_native
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scorer", ["quest", "mean", "biased"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_one_call_scoring_selection_and_attention_equals_its_pytorch_steps(dtype, scorer,
                                                                          causal):
    """attend_best_pages (the native kernel where built) against the same steps in PyTorch,
    on a padded batch, from the pages' features."""
    scorer = BiasedScorer() if scorer == "biased" else SCORERS[scorer]
    q, k, v = qkv(dtype, t_q=4)
    mask = padding_mask()
    ranks = (mask.long().cumsum(-1) - 1).masked_fill(~mask, -1)
    pages = torch.where(ranks >= 0, ranks // PAGE, -1)
    compute = torch.promote_types(dtype, torch.float32)
    features = scorer.features(summarize(k.to(compute), pages, -(-T // PAGE)))
    kw = dict(scorer=scorer, features=features, q_ranks=ranks[:, -4:], n_real=mask.sum(-1),
              budget=9, page=PAGE, sink_pages=1, local_pages=1, causal=causal, scale=0.4,
              rank_to_pos=rank_positions(mask))
    ref = attend_best_pages_reference(*(x.double() for x in (q, k, v)), **kw)
    out = attend_best_pages(q, k, v, **kw)
    assert out.dtype == dtype
    assert_close("pages in one call", ref, out.double(), TOLERANCE[dtype])


@needs_native
@pytest.mark.parametrize("scorer", ["quest", "biased"])
def test_float32_keys_with_bfloat16_features_run_the_kernel_of_that_pair(monkeypatch, scorer):
    """Page features kept in bfloat16 beside float32 keys are read as they are (the kernel of
    that pair, no float32 copy) and give the reference's result on the same rounded
    features."""
    real, used = native._library(), []

    class Spy:
        def __getattr__(self, name):
            used.append(name)
            return getattr(real, name)

    monkeypatch.setattr(native, "_library", Spy)
    scorer = BiasedScorer() if scorer == "biased" else SCORERS[scorer]
    q, k, v = qkv(torch.float32, t_q=4)
    mask = padding_mask()
    ranks = (mask.long().cumsum(-1) - 1).masked_fill(~mask, -1)
    pages = torch.where(ranks >= 0, ranks // PAGE, -1)
    features = scorer.features(summarize(k, pages, -(-T // PAGE))).to(torch.bfloat16)
    kw = dict(scorer=scorer, features=features, q_ranks=ranks[:, -4:], n_real=mask.sum(-1),
              budget=9, page=PAGE, sink_pages=1, local_pages=1, causal=True, scale=0.4,
              rank_to_pos=rank_positions(mask))
    out = attend_best_pages(q, k, v, **kw)
    assert used[-1] == "attnlab_page_attention_f32_bf16"
    ref = attend_best_pages_reference(*(x.double() for x in (q, k, v)), **kw)
    assert_close("float32 keys, bfloat16 features", ref, out.double(), TOLERANCE[torch.float32])


@needs_native
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page", [3, 4, 8, 16])
@pytest.mark.parametrize("t_q", [70, 1], ids=["prefill", "step"])
def test_the_page_kernel_reads_keys_transposed_or_in_place_as_the_reference(dtype, page, t_q):
    """A long prefill scores its keys from a copy transposed per page (the common page sizes
    with their own code), a step reads them in place: both equal the reference, padded."""
    t, heads, kv_heads = 70, 6, 2
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, heads, t_q, D, generator=gen, dtype=F64).to(dtype)
    k, v = (torch.randn(B, kv_heads, t, D, generator=gen, dtype=F64).to(dtype)
            for _ in range(2))
    mask = torch.ones(B, t, dtype=torch.bool)
    mask[0, :5] = False
    ranks = (mask.long().cumsum(-1) - 1).masked_fill(~mask, -1)
    scorer = SCORERS["quest"]
    features = scorer.features(summarize(k.to(torch.promote_types(dtype, torch.float32)),
                                         torch.where(ranks >= 0, ranks // page, -1),
                                         -(-t // page)))
    kw = dict(scorer=scorer, features=features, q_ranks=ranks[:, t - t_q:],
              n_real=mask.sum(-1), budget=3 * page, page=page, sink_pages=1, local_pages=1,
              causal=True, scale=0.4, rank_to_pos=rank_positions(mask))
    ref = attend_best_pages_reference(*(x.double() for x in (q, k, v)), **kw)
    out = attend_best_pages(q, k, v, **kw)
    # float32: 32 of its epsilons (sums over up to 48 keys, and the kernel's exp within 3e-7)
    tolerance = 32 * torch.finfo(dtype).eps if dtype == torch.float32 else TOLERANCE[dtype]
    assert_close("page kernel", ref, out.double(), tolerance)
