"""Oracle top-k attention: each query row attends to the keys that keep most of its attention.

An evaluation-only upper bound for key selectors such as SEA: with the same budget of keys
per row, no selector can keep more of the attention than the oracle does (it still computes
every score, O(Tq * Tk)). It bounds the attention mass kept in each layer, not the model's
perplexity: layers interact and perplexity is not monotone in the mass kept, so a selector
can tie it in perplexity or come marginally below. Grouping (:data:`GROUPS`):

* ``"kv"`` (the ceiling): per KV head and query row, the ``k`` keys with the largest
  attention probability summed over the KV head's query heads (softmax per query head over
  its allowed keys, score bias included), and every query head of the group attends to
  exactly those keys: ``k`` is the keys read per query token per KV head, as a sparse kernel
  that loads each selected key once for its whole GQA group would read. It is the ceiling of
  that budget because the objective, the probability mass kept summed over the group's heads,
  is additive over keys: the ``k`` keys of largest summed probability keep the most mass of
  any ``k`` keys.
* ``"head"``: each query head keeps its own ``k`` keys of highest score (the query heads of a
  GQA group choose apart, so together they read up to ``(H / Hk) * k`` keys per KV head);
* ``"heads"``: a row's ``H * Tk`` (head, key) raw scores are ranked jointly and the best
  ``H * k`` kept, as SEA's ``topk_group="heads"``. Softmax ignores a per-head shift of the
  scores, so this ranking across heads is arbitrary, and a head can be left with no key.

With ``page > 1`` (group ``"kv"`` only) the unit of the choice is a page of ``page`` real
keys (counted by rank among the real keys, as the page selectors of
:mod:`attnlab.ops.attention.pages` count them): per KV head and row, the ``k // page``
pages of largest summed probability. By the same additivity no choice of that many pages
keeps more, so it is the ceiling of every page selector (Quest, block top-k, ``sea_pages``)
at that page size, and its distance to the key-level oracle is what the page granularity
itself costs.

Then exact softmax over the kept keys. Causal (queries are the last ``Tq`` keys) and key
padding (True = real key) are respected; a row with fewer allowed keys than its budget keeps
them all, one with none gives 0. :func:`oracle_keep` is the selection both ops use.
:func:`oracle_attention` works in blocks of queries (memory O(block * H * Tk));
:func:`oracle_attention_naive` is the one-matrix, full-sort reference.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.attention.masks import (
    allowed_keys,
    attend_kept,
    expand_kv_heads,
    key_pages,
    key_ranks,
)

GROUPS = ("kv", "head", "heads")
QUERY_BLOCK = 256


def check_oracle(k: int, group: str, page: int = 1) -> None:
    """``ValueError`` unless ``k >= 1``, ``group`` is one of :data:`GROUPS` and ``page``
    (``"kv"`` only) divides ``k``."""
    if k < 1:
        raise ValueError(f"k must be >= 1 key, got {k}")
    if group not in GROUPS:
        raise ValueError(f"group must be one of {list(GROUPS)}, got {group!r}")
    if page < 1:
        raise ValueError(f"page must be >= 1 key, got {page}")
    if page > 1 and group != "kv":
        raise ValueError(f"page {page} needs group 'kv' (pages are read per KV head), got "
                         f"{group!r}")
    if k % page:
        raise ValueError(f"k {k} is not a whole number of pages of {page} keys; give a "
                         f"multiple of {page}, e.g. {max(page, k // page * page)}")


def _top(cells: Tensor, n: int, full_sort: bool) -> Tensor:
    """Bool mask of the ``n`` largest entries of each last-dim row of ``cells`` (all of a row
    shorter than ``n``): by ``topk``, or by a full stable sort (the reference)."""
    if full_sort:
        return cells.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1) < n
    top = cells.topk(min(n, cells.shape[-1]), dim=-1).indices
    return torch.zeros_like(cells, dtype=torch.bool).scatter_(-1, top, True)


def _top_pages(mass: Tensor, pages: Tensor, n: int, full_sort: bool) -> Tensor:
    """mass ``[B, Hk, Tq, Tk]`` (-1: a key no head may read), pages ``[B, Tk]`` (each key's
    page, -1 for padding) -> bool ``[B, Hk, Tq, Tk]``: the keys of the ``n`` pages of largest
    summed mass (pages with no readable key never chosen)."""
    n_pages = int(pages.max()) + 2  # the last collects the padding keys
    index = torch.where(pages >= 0, pages, n_pages - 1)[:, None, None, :].expand_as(mass)
    readable = (mass >= 0) & (pages >= 0)[:, None, None, :]
    shape = (*mass.shape[:-1], n_pages)
    page_mass = mass.new_zeros(shape).scatter_add_(-1, index, mass.clamp_min(0))
    any_readable = mass.new_zeros(shape).scatter_add_(-1, index, readable.to(mass.dtype)) > 0
    chosen = _top(page_mass.masked_fill(~any_readable, -1.0), n, full_sort) & any_readable
    return chosen.gather(-1, index)


def oracle_keep(scores: Tensor, *, budget: int, group: str, n_kv_heads: int,
                full_sort: bool = False, page: int = 1, pages: Tensor | None = None) -> Tensor:
    """The oracle's selection: scores ``[B, H, Tq, Tk]`` (bias included; -inf = not allowed;
    query head ``i`` reads KV head ``i // (H / n_kv_heads)``) -> ``[B, H, Tq, Tk]`` bool, the
    allowed keys each (head, row) attends to (see the module for ``group``). With ``page >
    1``, ``pages`` ``[B, Tk]`` is each key's page (-1 for padding) and whole pages are kept.
    Not differentiable; ``full_sort`` ranks by a full sort instead of ``topk``."""
    check_oracle(budget, group, page)
    scores = scores.detach()
    b, h, t_q, t_k = scores.shape
    allowed = scores > float("-inf")
    if group == "head":
        keep = _top(scores, budget, full_sort)
    elif group == "heads":
        flat = scores.transpose(1, 2).reshape(b, t_q, h * t_k)
        keep = _top(flat, h * budget, full_sort).view(b, t_q, h, t_k).transpose(1, 2)
    else:
        if h % n_kv_heads:
            raise ValueError(f"{h} query heads are not a multiple of {n_kv_heads} key/value "
                             "heads")
        g = h // n_kv_heads
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: 0
        mass = probs.reshape(b, n_kv_heads, g, t_q, t_k).sum(2)
        # below any probability: a key no head of the group may read is never preferred
        mass = mass.masked_fill(~allowed.reshape(b, n_kv_heads, g, t_q, t_k).any(2), -1.0)
        if page == 1:
            keep = _top(mass, budget, full_sort)
        else:
            if pages is None:
                raise ValueError("page > 1 needs each key's page")
            keep = _top_pages(mass, pages, budget // page, full_sort)
        keep = keep.repeat_interleave(g, dim=1)
    return keep & allowed


def _scores(q: Tensor, k: Tensor, allowed: Tensor | None, scale: float,
            bias: Tensor | None) -> Tensor:
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))


def _query_blocks(t_q: int, t_k: int, block: int, causal: bool,
                  key_padding_mask: Tensor | None, score_bias: Tensor | None,
                  device: torch.device) -> Iterator[tuple[int, int, int, Tensor | None,
                                                          Tensor | None]]:
    """Blocks of ``block`` queries: ``(start, stop, t_seen, allowed, bias)``, the keys after
    the block's last query left out when causal (``t_seen`` keys: never allowed), the allowed
    pairs (:func:`allowed_keys`) and the block's score bias."""
    for start in range(0, t_q, block):
        stop = min(start + block, t_q)
        t_seen = t_k - t_q + stop if causal else t_k
        padding = None if key_padding_mask is None else key_padding_mask[:, :t_seen]
        allowed = allowed_keys(stop - start, t_seen, causal=causal, key_padding_mask=padding,
                               device=device)
        bias = None if score_bias is None else score_bias[..., start:stop, :t_seen]
        yield start, stop, t_seen, allowed, bias


def _oracle(q: Tensor, k: Tensor, v: Tensor, *, scale: float, budget: int, group: str,
            causal: bool, key_padding_mask: Tensor | None, score_bias: Tensor | None,
            block: int, full_sort: bool, page: int) -> Tensor:
    check_oracle(budget, group, page)
    h, h_kv, t_q, t_k = q.shape[1], k.shape[1], q.shape[-2], k.shape[-2]
    ranks = key_ranks(key_padding_mask, q.shape[0], t_k, q.device)
    pages = key_pages(ranks, page)
    k, v = expand_kv_heads(k, h), expand_kv_heads(v, h)
    out = []
    for start, stop, t_seen, allowed, bias in _query_blocks(
            t_q, t_k, block, causal, key_padding_mask, score_bias, q.device):
        scores = _scores(q[..., start:stop, :], k[..., :t_seen, :], allowed, scale, bias)
        keep = oracle_keep(scores, budget=budget, group=group, n_kv_heads=h_kv,
                           full_sort=full_sort, page=page, pages=pages[:, :t_seen])
        out.append(attend_kept(scores, v[..., :t_seen, :], keep))
    return torch.cat(out, dim=-2)


def _kv_block(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float,
              bias: Tensor | None, budget: int) -> Tensor:
    """The key-level ``"kv"`` oracle of one block of queries: q ``[B, H, b, D]``, k, v
    ``[B, Hk, Ts, D]``, allowed ``[B or 1, 1, b, Ts]`` or None, bias ``[B or 1, H or 1, b,
    Ts]`` or None -> ``[B, H, b, Dv]``."""
    b, h, rows, d = q.shape
    h_kv, t_s = k.shape[1], k.shape[2]
    g = h // h_kv
    # [B, Hk, g, b, Ts]: the group's heads share their KV head's keys, nothing is repeated
    scores = ((q.reshape(b, h_kv, g * rows, d) * scale) @ k.transpose(-1, -2)).view(
        b, h_kv, g, rows, t_s)
    if bias is not None:
        heads = (h_kv, g) if bias.shape[1] == h else (1, 1)
        scores = scores + bias.reshape(bias.shape[0], *heads, rows, t_s)
    if allowed is not None:
        scores.masked_fill_(~allowed[:, :, None], float("-inf"))
    with torch.no_grad():  # a key no head may read has mass 0 and, if kept, weight 0
        mass = torch.softmax(scores, dim=-1).nan_to_num_(0.0).sum(2)  # a row with no key: 0
        kept = mass.topk(min(budget, t_s), dim=-1).indices  # [B, Hk, b, n]
    index = kept[:, :, None].expand(-1, -1, g, -1, -1)
    chosen = scores.gather(-1, index)
    any_key = chosen.isfinite().any(-1, keepdim=True)  # a kept key this head may read
    weights = torch.softmax(chosen.masked_fill(~any_key, 0.0), dim=-1) * any_key
    # a dense product over the scattered weights: faster on CPU than gathering the values
    dense = torch.zeros_like(scores).scatter_(-1, index, weights)
    return (dense.view(b, h_kv, g * rows, t_s) @ v).view(b, h, rows, -1)


def _oracle_kv(q: Tensor, k: Tensor, v: Tensor, *, scale: float, budget: int, causal: bool,
               key_padding_mask: Tensor | None, score_bias: Tensor | None) -> Tensor:
    """The key-level ``"kv"`` oracle in blocks of :data:`QUERY_BLOCK` queries, the keys'
    scores computed once per KV head (:func:`oracle_attention`'s fast path)."""
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} "
                         "key/value heads")
    out = []
    for start, stop, t_seen, allowed, bias in _query_blocks(
            q.shape[-2], k.shape[-2], QUERY_BLOCK, causal, key_padding_mask, score_bias,
            q.device):
        out.append(_kv_block(q[..., start:stop, :], k[..., :t_seen, :], v[..., :t_seen, :],
                             allowed, scale, bias, budget))
    return torch.cat(out, dim=-2)


def oracle_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, budget: int, group: str = "kv",
    causal: bool = True, key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None, page: int = 1,
) -> Tensor:
    """Exact attention over each row's oracle keys (:func:`oracle_keep`).

    q ``[B, H, Tq, D]`` (the last ``Tq`` of the keys), k, v ``[B, Hk, Tk, D]`` (``Hk``
    divides ``H``), key_padding_mask ``[B, Tk]`` (True = real key) -> ``[B, H, Tq, Dv]``.
    ``budget``: keys per KV head per row (``"kv"``), per head (``"head"``), or ``H * budget``
    (head, key) cells per row (``"heads"``).
    ``score_bias``: added to the scores before the selection, ``[B or 1, H or 1, Tq, Tk]``.
    ``page``: the keys of the unit kept (``"kv"``; ``budget // page`` pages per row).
    The key-level ``"kv"`` oracle has a path of its own that scores each KV head's keys once
    for its group and takes one softmax over all keys; the others mask dense scores.
    """
    check_oracle(budget, group, page)
    if group == "kv" and page == 1:
        return _oracle_kv(q, k, v, scale=scale, budget=budget, causal=causal,
                          key_padding_mask=key_padding_mask, score_bias=score_bias)
    return _oracle(q, k, v, scale=scale, budget=budget, group=group, causal=causal,
                   key_padding_mask=key_padding_mask, score_bias=score_bias,
                   block=QUERY_BLOCK, full_sort=False, page=page)


def oracle_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, budget: int, group: str = "kv",
    causal: bool = True, key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None, page: int = 1,
) -> Tensor:
    """Reference of :func:`oracle_attention`: every score in one matrix, the kept keys by
    a full sort."""
    return _oracle(q, k, v, scale=scale, budget=budget, group=group, causal=causal,
                   key_padding_mask=key_padding_mask, score_bias=score_bias,
                   block=max(q.shape[-2], 1), full_sort=True, page=page)


def _example(gen: torch.Generator, *, group: str = "kv", budget: int = 5, causal: bool = True,
             padded: bool = False, biased: bool = True, page: int = 1, t_q: int = 37,
             t_k: int = 37) -> contract.Example:
    """Batch 2, 4 query heads of 2 KV heads; padding: a hole, and left padding (rows with no
    key)."""
    qkv = contract.attention_inputs(gen, t_q=t_q, t_k=t_k)
    padding = contract.padding_mask(2, t_k) if padded else None
    bias = contract.normal(gen, 1, 4, t_q, t_k) if biased else None
    return contract.Example({**qkv, "scale": 0.3, "budget": budget, "group": group,
                             "causal": causal, "page": page, "key_padding_mask": padding,
                             "score_bias": bias}, contract.attention_shape(qkv))


_BLOCKS = ((f"{__name__}.QUERY_BLOCK", 8),)  # several blocks
_LAYOUTS = ((True, False, 37), (True, True, 37), (True, True, 3), (False, True, 37))
"""(causal, padded, queries) of the cases: the last 3 queries are those after a cache."""

contract.register(contract.OpContract(
    "oracle_attention", oracle_attention, oracle_attention_naive, _example,
    cases=(
        *(case for causal, padded, t_q in _LAYOUTS
          for case in contract.grid(patches=_BLOCKS, group=GROUPS, budget=(1, 5, 40),
                                    causal=(causal,), padded=(padded,), t_q=(t_q,))),
        *(case for causal, padded, t_q in _LAYOUTS
          for case in contract.grid(patches=_BLOCKS, page=(4,), budget=(4, 12), biased=(False,),
                                    causal=(causal,), padded=(padded,), t_q=(t_q,))),
        contract.Case("one-query-one-key", {"budget": 1, "t_q": 1, "t_k": 1}),
    ),
    grads=("q", "k", "v", "score_bias"),
    low_precision=contract.FLOAT32,
))
