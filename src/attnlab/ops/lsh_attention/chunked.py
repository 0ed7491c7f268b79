"""Reformer LSH attention: hash, sort, attend within chunks of the sorted order, un-sort.

The entry point :func:`lsh_attention` also dispatches causal attention to the strictly causal
per-bucket chunking of :mod:`attnlab.ops.lsh_attention.causal`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.lsh_attention.causal import causal_lsh_attention
from attnlab.ops.lsh_attention.common import (
    combine_rounds,
    masked_logits,
    prepare_inputs,
    softmax_stats,
)
from attnlab.ops.lsh_attention.hashing import default_n_buckets, draw_rotations, lsh_order
from attnlab.ops.lsh_attention.naive import lsh_attention_naive


def _with_previous(x: Tensor, n_chunks: int) -> Tensor:
    """``[B, H, R, nc, C, ...]`` -> each chunk's rows followed by those of the cyclically previous
    chunk (``2C`` rows); unchanged when there is a single chunk."""
    if n_chunks == 1:
        return x
    return torch.cat([x, x.roll(1, dims=3)], dim=4)


def lsh_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    n_hashes: int,
    bucket_size: int,
    causal: bool,
    generator_or_rotations: Tensor | torch.Generator | None = None,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Reformer shared-QK LSH attention, O(n_hashes * T * bucket_size) memory.

    Per hash round, keys are L2-normalised and hashed by ``argmax([k R, -k R])`` (angular LSH).

    * ``causal=False``: positions are sorted by (bucket, position) and cut into chunks of
      ``bucket_size``; each chunk attends to itself and the cyclically previous chunk (no
      look-back with a single chunk). ``T`` need not divide ``bucket_size``: the sorted order
      is padded internally with masked positions.
    * ``causal=True``: strictly causal variant (:mod:`attnlab.ops.lsh_attention.causal`): query
      ``i`` attends to earlier keys *of its own bucket* in its within-bucket chunk and the one
      before it. Chunk boundaries depend on the past only, so changing future tokens (even
      their hashes) leaves earlier outputs bitwise unchanged. Queries may be the last ``Tq`` of
      the ``Tk`` key positions (decoding with a cache).

    Masks use original positions: causal, key padding, and self-attention only as a last
    resort (logit :data:`SELF_LOGIT`). Padding positions hash to a bucket of their own, so
    real outputs do not depend on padded tokens in any way. Rounds are
    combined by their log-sum-exp weights (a key found in several rounds is not de-duplicated).

    Shared QK: hashing and scores use the *normalised keys*; pass ``k = q`` (the shared
    projection) for Reformer. Position ``i``'s query is bucketed with key ``i``.

    Args:
        q: ``[B, H, Tq, D]``; k: ``[B, Hk, Tk, D]``; v: ``[B, Hv, Tk, Dv]``; ``Hk`` and ``Hv``
            divide ``H``. ``Tq == Tk`` unless causal.
        n_hashes: hash rounds.
        bucket_size: chunk length (in the sorted order, or within a bucket when causal).
        causal: key ``j`` is visible to query ``i`` only when ``j <= i``.
        generator_or_rotations: ``[n_hashes, D, n_buckets // 2]`` rotations (see
            :func:`draw_rotations`), or a generator / None to draw them with
            :func:`default_n_buckets` buckets for ``Tk`` (pass fixed rotations when outputs
            must not depend on the sequence length, e.g. for causal decoding).
        key_padding_mask: ``[B, Tk]`` bool, True = real key.
        scale: multiplies ``q . k_normalised``; default ``D^-0.5``.
    Returns:
        ``[B, H, Tq, Dv]`` in ``q.dtype``; a query with no allowed key (a padding position)
        outputs zeros.
    """
    x = prepare_inputs(
        q, k, v, n_hashes=n_hashes, bucket_size=bucket_size,
        generator_or_rotations=generator_or_rotations, key_padding_mask=key_padding_mask,
        scale=scale,
    )
    if causal:
        return causal_lsh_attention(x, bucket_size).to(q.dtype)
    b, n_heads, t, _ = q.shape
    if k.shape[-2] != t:
        raise ValueError(f"bidirectional LSH attention needs Tq == Tk, got {t} and {k.shape[-2]}")
    order = lsh_order(x.k, x.rotations, bucket_size, x.key_ok)  # [B, H, R, Tp]
    t_pad = order.shape[-1]
    n_chunks = t_pad // bucket_size
    chunks = (b, n_heads, n_hashes, n_chunks, bucket_size)

    def sort(y: Tensor) -> Tensor:  # [B, H, T, E] -> [B, H, R, nc, C, E] in sorted order
        y = F.pad(y, (0, 0, 0, t_pad - t)).unsqueeze(2).expand(-1, -1, n_hashes, -1, -1)
        idx = order.unsqueeze(-1).expand(-1, -1, -1, -1, y.shape[-1])
        return y.gather(3, idx).view(*chunks, y.shape[-1])

    key_ok = F.pad(x.key_ok, (0, t_pad - t), value=False)[:, None, None, :]
    key_ok = key_ok.expand(b, n_heads, n_hashes, t_pad).gather(3, order).view(chunks)
    pos = order.view(chunks)
    keys, values = _with_previous(sort(x.k), n_chunks), _with_previous(sort(x.v), n_chunks)
    scores = sort(x.q) @ keys.transpose(-1, -2) * x.scale  # [B, H, R, nc, C, C or 2C]
    logits = masked_logits(
        scores,
        pos.unsqueeze(-1),
        _with_previous(pos, n_chunks).unsqueeze(-2),
        _with_previous(key_ok, n_chunks).unsqueeze(-2),
        causal=False,
    )
    outs, lse = softmax_stats(logits, values)
    unsort = order.argsort(dim=-1)[..., :t]
    outs = outs.reshape(b, n_heads, n_hashes, t_pad, -1)
    outs = outs.gather(3, unsort.unsqueeze(-1).expand(-1, -1, -1, -1, outs.shape[-1]))
    lse = lse.reshape(b, n_heads, n_hashes, t_pad).gather(3, unsort)
    return combine_rounds(outs, lse).to(q.dtype)


def _example(gen: torch.Generator, *, causal: bool = True, n_hashes: int = 2, t: int = 37,
             bucket_size: int = 8, n_buckets: int | None = None, hk: int = 2,
             padded: bool = True) -> contract.Example:
    """Batch 2, 2 query heads, rotations for ``n_buckets`` buckets (None: the default for
    ``t``); ``padded``: about 1 key in 4 padded."""
    qkv = contract.attention_inputs(gen, h=2, hk=hk, t_q=t, t_k=t)
    n_buckets = n_buckets or default_n_buckets(t, bucket_size)
    return contract.Example(
        {**qkv, "n_hashes": n_hashes, "bucket_size": bucket_size, "causal": causal,
         "generator_or_rotations": draw_rotations(n_hashes, 8, n_buckets, generator=gen,
                                                  dtype=torch.float64),
         "key_padding_mask": torch.rand(2, t, generator=gen) > 0.25 if padded else None},
        contract.attention_shape(qkv))


contract.register(contract.OpContract(
    "lsh_attention", lsh_attention, lsh_attention_naive, _example,
    cases=(
        # T not a multiple of the bucket size
        *contract.grid(causal=(True, False), n_hashes=(1, 2)),
        *contract.grid(label="grouped", causal=(True, False), n_hashes=(1, 2), t=(32,), hk=(1,),
                       padded=(False,)),
        # two chunks: the previous chunk of chunk 0 is chunk 1
        *contract.grid(label="two-chunks", causal=(True, False), n_hashes=(1, 2), t=(20,),
                       bucket_size=(16,)),
        # causal: about 10 keys per bucket, so buckets span several chunks
        *contract.grid(label="long-buckets", causal=(True, False), n_hashes=(1, 2), t=(41,),
                       bucket_size=(4,), n_buckets=(4,)),
        contract.Case("one-token", {"t": 1, "padded": False}),
    ),
    low_precision=contract.FLOAT32_BFLOAT16,
))
