"""Training-free key selection by pages of keys: Quest and block top-k (InfLLM / MoBA).

The keys are cut into pages of ``page`` real keys (counted by rank among the real keys, so
left padding does not move the pages). For each query row and KV head the op keeps ``budget``
keys' worth of pages (``budget // page``): the first ``sink_pages`` pages (attention sinks),
the query's own page and the ``local_pages - 1`` before it (the recent keys), and the rest
the best-scored pages; then exact softmax over the kept keys (causal and padding masks
still apply inside the pages). Each query head scores every page:

``quest`` (Quest's bound), ``mean`` (block top-k) or a learned
:class:`~attnlab.ops.attention.page_scorers.PageScorer` (e.g. the estimator of the
``sea_pages`` core), from the pages' summaries (:mod:`attnlab.ops.attention.page_summary`).

The query heads of a KV group read the same keys: each head's page scores become
probabilities (softmax over the pages it may read, the scores scaled as logits), summed over
the group, and the group keeps the top pages of that sum. So ``budget`` is what a decode step
reads per query token per KV head. The selection is not differentiable (gradients flow
through the attention over the kept keys); a score bias is added to the kept keys' scores,
and does not take part in the selection.

:func:`paged_attention` runs on the executor
:func:`~attnlab.ops.sparse_attention.executors.executor_for` picks. ``native``: one call
scores, selects and attends for every row from the pages' features
(:func:`~attnlab.ops.attention.page_step.attend_best_pages`: memory O(T / page), keys read in
place). ``flex``: the rows' selection (:func:`select_page_rows`) through FlexAttention's
block-sparse kernel; ``triton``: the same selection through one Triton kernel (no
gradients; a GPU's decoding rows). ``torch``: blocks of queries (memory O(block * Tk));
without padding or a score bias and with at least :data:`GATHER_RATIO` times the budget in
keys, it gathers the kept pages' keys and values (:func:`gathered_page_attention`), and
else it masks a dense score block; :func:`paged_attention_naive` selects by loops over rows
and heads, its reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.attention.masks import (
    allowed_keys,
    expand_kv_heads,
    key_pages,
    key_ranks,
    masked_attention,
    rank_positions,
)
from attnlab.ops.attention.page_rules import check_pages, page_masks, select_pages
from attnlab.ops.attention.page_scorers import PageScorer, scorer_logits, scorer_of
from attnlab.ops.attention.page_step import attend_best_pages
from attnlab.ops.attention.page_summary import summarize
from attnlab.ops.sparse_attention.executors import executor_for
from attnlab.ops.sparse_attention.flex import attend_pages_flex
from attnlab.ops.sparse_attention.pages import (
    PageSelection,
    attend_pages_triton,
    pages_from_kept,
    row_limits,
)

QUERY_BLOCK = 256
GATHER_RATIO = 16
"""A query block gathers its kept pages (rather than masking a dense score block) when it
sees at least this many times the budget in keys. Measured on the 2-core dev box, one
SmolLM2 layer (9 x 64, 3 KV heads) at 8192 tokens, Quest: gathered 2.0 s at a budget of 256
and 6.7 s at 1024, masked 3.2 s at either (SDPA: 0.57 s); per-row gathers copy
``budget`` keys per row and KV head, so they win only well below the context."""


def page_logits(q: Tensor, k: Tensor, pages: Tensor, n_pages: int, q_pages: Tensor,
                scorer: PageScorer, scale: float) -> Tensor:
    """Page logits ``[B, H, Tq, P]`` of q ``[B, H, Tq, D]`` over the pages ``[B, Tk]`` (-1:
    padding) of k ``[B, Hk, Tk, D]``, by ``scorer``; q_pages ``[B, Tq]``: each query's page."""
    return scorer_logits(scorer, q, scorer.features(summarize(k, pages, n_pages)), q_pages,
                         scale)


def all_page_features(k: Tensor, ranks: Tensor, page: int, scorer: PageScorer,
                      dtype: torch.dtype | None = None) -> Tensor:
    """``scorer``'s features ``[B, Hk or H, P, F]`` of every page of k ``[B, Hk, Tk, D]``
    (ranks ``[B, Tk]``: :func:`~attnlab.ops.attention.masks.key_ranks`; ``P = ceil(Tk /
    page)``, from the shape, so nothing is read back to the host: the pages past a padded
    row's real keys are never candidates), computed from keys in at least float32 and kept
    in ``dtype`` (None: the keys'; a 16-bit model's in 16 bits: a decoding state holds them
    beside the cache)."""
    n_pages = max(1, -(-k.shape[-2] // page))
    compute = torch.promote_types(k.dtype, torch.float32)  # scores of 16-bit keys in fp32
    features = scorer.features(summarize(k.to(compute), key_pages(ranks, page), n_pages))
    return features.to(k.dtype if dtype is None else dtype)


def kept_pages(q: Tensor, k: Tensor, *, scale: float, budget: int, page: int,
               scorer: str | PageScorer, sink_pages: int, local_pages: int, causal: bool,
               key_padding_mask: Tensor | None, q_start: int | None = None
               ) -> tuple[Tensor, Tensor]:
    """(the pages each row keeps per KV head ``[B, Hk, Tq, P]`` bool, each key's rank among
    the real keys ``[B, Tk]``, -1 for padding) for q ``[B, H, Tq, D]`` at key positions
    ``q_start ...`` (None: the last ``Tq`` of the keys) and k ``[B, Hk, Tk, D]``."""
    b, h_kv, t_k, _ = k.shape
    t_q = q.shape[-2]
    q_start = t_k - t_q if q_start is None else q_start
    with torch.no_grad():
        ranks = key_ranks(key_padding_mask, b, t_k, k.device)
        pages = key_pages(ranks, page)
        n_pages = max(1, -(-t_k // page))
        q_ranks = ranks[:, q_start:q_start + t_q]
        logits = page_logits(q.detach(), k.detach(), pages, n_pages,
                             q_ranks.clamp_min(0) // page, scorer_of(scorer), scale)
        n_real = ranks.max(-1).values + 1
        readable, forced = page_masks(n_real, q_ranks, n_pages, page, sink_pages, local_pages,
                                      causal)
        kept = select_pages(logits, h_kv, readable, forced,
                            budget // page - sink_pages - local_pages)
        return kept, ranks


def select_page_rows(q: Tensor, k: Tensor, *, scale: float, budget: int, page: int,
                     scorer: str | PageScorer, sink_pages: int, local_pages: int,
                     causal: bool, key_padding_mask: Tensor | None) -> PageSelection:
    """The pages each row of q ``[B, H, Tq, D]`` (the last ``Tq`` of the keys) keeps per KV
    head of k ``[B, Hk, Tk, D]``, as a selection for any executor; selected in blocks of
    :data:`QUERY_BLOCK` queries (memory O(block * Tk / page))."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    pages, ranks = [], None
    for start in range(0, t_q, QUERY_BLOCK):
        kept, ranks = kept_pages(q[..., start:start + QUERY_BLOCK, :], k, scale=scale,
                                 budget=budget, page=page, scorer=scorer,
                                 sink_pages=sink_pages, local_pages=local_pages,
                                 causal=causal, key_padding_mask=key_padding_mask,
                                 q_start=t_k - t_q + start)
        pages.append(pages_from_kept(kept, budget // page))
    q_ranks = ranks[:, t_k - t_q:]
    return PageSelection(torch.cat(pages, dim=-2), page,
                         row_limits(q_ranks, ranks.max(-1).values + 1, causal),
                         None if key_padding_mask is None else rank_positions(key_padding_mask))


def paged_keep(q: Tensor, k: Tensor, *, scale: float, budget: int, page: int,
               scorer: str | PageScorer, sink_pages: int, local_pages: int, causal: bool,
               key_padding_mask: Tensor | None, q_start: int | None = None) -> Tensor:
    """The keys each row keeps per KV head, ``[B, Hk, Tq, Tk]`` bool (before the causal and
    padding masks), for q ``[B, H, Tq, D]`` (at key positions ``q_start ...``, as
    :func:`kept_pages`), k ``[B, Hk, Tk, D]``."""
    kept, ranks = kept_pages(q, k, scale=scale, budget=budget, page=page, scorer=scorer,
                             sink_pages=sink_pages, local_pages=local_pages, causal=causal,
                             key_padding_mask=key_padding_mask, q_start=q_start)
    pages = key_pages(ranks, page)
    b, h_kv, t_q, _ = kept.shape
    at_key = pages.clamp_min(0)[:, None, None, :].expand(b, h_kv, t_q, k.shape[-2])
    return kept.gather(-1, at_key) & (pages >= 0)[:, None, None, :]


def gathered_page_attention(q: Tensor, k: Tensor, v: Tensor, kept: Tensor, page: int,
                            n_pages: int, scale: float, causal: bool) -> Tensor:
    """Exact softmax of q ``[B, H, Tq, D]`` over the keys of its ``kept`` pages
    ``[B, Hk, Tq, P]`` (at most ``n_pages`` per row) of unpadded k, v ``[B, Hk, Tk, D]``,
    reading only those pages: their keys and values are gathered (``[B, Hk, Tq, n_pages *
    page, D]``), so the cost follows the budget, not ``Tk``. Equal to
    :func:`attend_kept_keys` of the same selection (tested)."""
    b, h, t_q, d = q.shape
    h_kv, t_k = k.shape[1], k.shape[-2]
    n_all = kept.shape[-1]
    with torch.no_grad():
        slot, index = kept.to(q.dtype).topk(min(n_pages, n_all), dim=-1)
        keys = index[..., None] * page + torch.arange(page, device=q.device)
        valid = (slot[..., None] > 0) & (keys < t_k)
        if causal:
            q_pos = torch.arange(t_k - t_q, t_k, device=q.device)
            valid &= keys <= q_pos[:, None, None]
        valid = valid.flatten(-2)
    padded = n_all * page - t_k
    rows_b = torch.arange(b, device=q.device)[:, None, None, None]
    rows_h = torch.arange(h_kv, device=q.device)[None, :, None, None]

    def gather(x: Tensor) -> Tensor:
        x = torch.nn.functional.pad(x, (0, 0, 0, padded)).view(b, h_kv, n_all, page, -1)
        return x[rows_b, rows_h, index].flatten(-3, -2)  # [B, Hk, Tq, n * page, D]

    k_kept, v_kept = gather(k), gather(v)
    group = q.view(b, h_kv, h // h_kv, t_q, d)
    scores = torch.einsum("bkgtd,bktjd->bkgtj", group, k_kept) * scale
    keep = valid[:, :, None].expand_as(scores)
    kept_any = keep.any(-1, keepdim=True)
    logits = scores.masked_fill(~keep, float("-inf")).masked_fill(~kept_any, 0.0)
    probs = torch.softmax(logits, dim=-1) * kept_any
    out = torch.einsum("bkgtj,bktjd->bkgtd", probs, v_kept)
    return out.reshape(b, h, t_q, v.shape[-1])


def attend_kept_keys(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, allowed: Tensor | None,
                     scale: float, bias: Tensor | None) -> Tensor:
    """Exact softmax of q ``[B, H, Tq, D]`` over the keys ``keep`` ``[B, Hk, Tq, Tk]`` (and
    ``allowed``) of k, v ``[B, Hk, Tk, D]`` -> ``[B, H, Tq, Dv]`` (0 for a row with none)."""
    keep = expand_kv_heads(keep, q.shape[1])
    return masked_attention(q, k, v, keep if allowed is None else keep & allowed, scale, bias)


def paged_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, budget: int, page: int = 16,
    scorer: str | PageScorer = "quest", sink_pages: int = 1, local_pages: int = 1,
    causal: bool = True, key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None, features: Tensor | None = None, executor: str = "auto",
) -> Tensor:
    """Exact attention over each row's pages kept per KV head (module docstring).

    q ``[B, H, Tq, D]`` (the last ``Tq`` of the keys), k, v ``[B, Hk, Tk, D]`` (``Hk``
    divides ``H``), key_padding_mask ``[B, Tk]`` (True = real key), score_bias
    ``[B or 1, H or 1, Tq, Tk]`` -> ``[B, H, Tq, Dv]``. ``features``: the pages' features
    (:func:`all_page_features`) where the caller holds them, or None. ``executor``: which
    computes the attention (:func:`~attnlab.ops.sparse_attention.executors.executor_for`).
    """
    check_pages(budget, page, sink_pages, local_pages)
    scorer = scorer_of(scorer)
    t_q, t_k = q.shape[-2], k.shape[-2]
    chosen = executor_for(executor, q, k, v, biased=score_bias is not None, triton_fits=True)
    if chosen in ("flex", "triton"):
        selection = select_page_rows(q, k, scale=scale, budget=budget, page=page,
                                     scorer=scorer, sink_pages=sink_pages,
                                     local_pages=local_pages, causal=causal,
                                     key_padding_mask=key_padding_mask)
        attend = attend_pages_flex if chosen == "flex" else attend_pages_triton
        return attend(q, k, v, selection, scale=scale)
    if chosen == "native":  # one native call for every row
        ranks = key_ranks(key_padding_mask, q.shape[0], t_k, k.device)
        if features is None:
            features = all_page_features(k, ranks, page, scorer)
        return attend_best_pages(
            q, k, v, scorer=scorer, features=features, q_ranks=ranks[:, t_k - t_q:],
            n_real=ranks.max(-1).values + 1, budget=budget, page=page, sink_pages=sink_pages,
            local_pages=local_pages, causal=causal, scale=scale,
            rank_to_pos=None if key_padding_mask is None else rank_positions(key_padding_mask))
    out = []
    for start in range(0, t_q, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, t_q)
        t_seen = t_k - t_q + stop if causal else t_k  # later keys are never allowed
        padding = None if key_padding_mask is None else key_padding_mask[:, :t_seen]
        k_seen, v_seen = k[..., :t_seen, :], v[..., :t_seen, :]
        q_block = q[..., start:stop, :]
        if padding is None and score_bias is None and GATHER_RATIO * budget <= t_seen:
            kept, _ = kept_pages(q_block, k_seen, scale=scale, budget=budget, page=page,
                                 scorer=scorer, sink_pages=sink_pages, local_pages=local_pages,
                                 causal=causal, key_padding_mask=None,
                                 q_start=t_k - t_q + start)
            out.append(gathered_page_attention(q_block, k_seen, v_seen, kept, page,
                                               budget // page, scale, causal))
            continue
        keep = paged_keep(q_block, k_seen, scale=scale, budget=budget, page=page,
                          scorer=scorer, sink_pages=sink_pages, local_pages=local_pages,
                          causal=causal, key_padding_mask=padding,
                          q_start=t_k - t_q + start)
        allowed = allowed_keys(stop - start, t_seen, causal=causal, key_padding_mask=padding,
                               device=q.device)
        bias = None if score_bias is None else score_bias[..., start:stop, :t_seen]
        out.append(attend_kept_keys(q_block, k_seen, v_seen, keep, allowed, scale, bias))
    return torch.cat(out, dim=-2)


def paged_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, budget: int, page: int = 16,
    scorer: str | PageScorer = "quest", sink_pages: int = 1, local_pages: int = 1,
    causal: bool = True, key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None,
) -> Tensor:
    """Reference of :func:`paged_attention`: for each row and KV head, the real keys listed
    and cut into pages, each candidate page scored by every head of the group from its keys,
    and the pages chosen by a full sort."""
    check_pages(budget, page, sink_pages, local_pages)
    scorer = scorer_of(scorer)
    b, h, t_q, _ = q.shape
    h_kv, t_k = k.shape[1], k.shape[-2]
    per = h // h_kv
    qd, kd = q.detach(), k.detach()  # the selection is not differentiated
    real = (torch.ones(b, t_k, dtype=torch.bool) if key_padding_mask is None
            else key_padding_mask.cpu())
    keep = torch.zeros(b, h_kv, t_q, t_k, dtype=torch.bool)
    for bi in range(b):
        positions = [j for j in range(t_k) if real[bi, j]]  # page p: positions[p*P:(p+1)*P]
        pages = [positions[i:i + page] for i in range(0, len(positions), page)]
        for i in range(t_q):
            at = t_k - t_q + i
            if at not in positions:
                continue  # a padded query keeps nothing (its output is ignored)
            own = positions.index(at) // page
            readable = [p for p in range(len(pages)) if not causal or p <= own]
            forced = [p for p in readable if p < sink_pages or own - local_pages < p <= own]
            candidates = [p for p in readable if p not in forced]
            for g in range(h_kv):
                total = {p: 0.0 for p in candidates}
                for head in range(g * per, (g + 1) * per):
                    logits = [scorer.page_logit(head, qd[bi, head, i], kd[bi, g, pages[p]],
                                                own - p, scale) for p in candidates]
                    probs = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
                    for p, prob in zip(candidates, probs.tolist(), strict=True):
                        total[p] += prob
                ranked = sorted(candidates, key=lambda p: -total[p])
                chosen = forced + ranked[:budget // page - sink_pages - local_pages]
                for p in chosen:
                    keep[bi, g, i, pages[p]] = True
    allowed = allowed_keys(t_q, t_k, causal=causal, key_padding_mask=key_padding_mask,
                           device=q.device)
    return attend_kept_keys(q, k, v, keep.to(q.device), allowed, scale, score_bias)


def _example(gen: torch.Generator, *, scorer: str = "quest", causal: bool = True,
             padded: bool = False, biased: bool = False, t_q: int = 23, t_k: int = 23,
             executor: str = "auto") -> contract.Example:
    """Batch 2, 4 query heads of 2 KV heads, pages of 3 keys, a budget of 4 pages; padding:
    a hole, and left padding (the outputs of padded queries are not defined); ``executor``
    for the fast op."""
    qkv = contract.attention_inputs(gen, t_q=t_q, t_k=t_k)
    padding = contract.padding_mask(2, t_k) if padded else None
    return contract.Example(
        {**qkv, "scale": 0.35, "budget": 12, "page": 3, "scorer": scorer, "sink_pages": 1,
         "local_pages": 1, "causal": causal, "key_padding_mask": padding,
         "score_bias": contract.normal(gen, 1, 4, t_q, t_k) if biased else None},
        contract.attention_shape(qkv), options={"executor": executor},
        defined=None if padding is None else padding[:, None, -t_q:, None])


contract.register(contract.OpContract(
    "paged_attention", paged_attention, paged_attention_naive, _example,
    cases=(
        *contract.grid(scorer=("quest", "mean"), causal=(True, False), padded=(False, True),
                       biased=(False, True)),
        # the gather executor, on every block that can take it
        *contract.grid(label="gathered", patches=((f"{__name__}.GATHER_RATIO", 1),),
                       scorer=("quest", "mean"), causal=(True, False)),
        *contract.grid(label="blocks", patches=((f"{__name__}.QUERY_BLOCK", 4),), padded=(True,),
                       causal=(True, False)),
        *contract.grid(label="cache", t_q=(1, 4), padded=(True,)),
        *contract.grid(executor=("flex", "torch"), causal=(True, False), padded=(False, True)),
        *contract.grid(label="one-query-one-key", t_q=(1,), t_k=(1,)),
    ),
    grads=("q", "k", "v", "score_bias"),
    low_precision=contract.FLOAT32,
))
