"""Exact attention over *runs*: cells given as ``(head, first rank, kept keys, width)``.

SEA's selected cells are bins of consecutive key ranks, each thinned to at most ``k`` evenly
spaced keys. Described as runs they need no per-key index list: slot ``o < count`` of a run
reads rank ``lo + floor(o * width / count)`` (``lo + o`` when nothing is thinned), mapped to a
key position by an optional ``rank_to_pos`` (ranks count real keys only, under padding).

:func:`run_attention` computes it with the native CPU kernel (:mod:`.native`: keys read in
place, an online softmax per head, no gathered copies) when the inputs allow (CPU, float32,
float64 or bfloat16, no autograd), and otherwise expands the runs (:func:`run_keys`) for
:func:`~attnlab.ops.sparse_attention.cell_attention`. :func:`run_attention_naive` is the dense
reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.attention.bias import BiasFn, DistanceBias
from attnlab.ops.sparse_attention import native
from attnlab.ops.sparse_attention.cells import cell_attention
from attnlab.ops.sparse_attention.executors import executor_for
from attnlab.ops.sparse_attention.naive import cell_attention_naive


def run_keys(
    lo: Tensor, width: Tensor, count: Tensor, rank_to_pos: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Key positions of runs, padded to the longest: (index int64, valid bool) ``[B, T, C, W]``.

    ``lo``, ``width``, ``count``: integer ``[B, T, C]`` (``0 <= count <= width``);
    ``rank_to_pos``: ``[B, Tk]`` rank -> key position, or None (identity). Invalid slots hold 0.
    """
    n_slots = max(1, int(count.max())) if count.numel() else 1
    offset = torch.arange(n_slots, device=lo.device)
    # slot o of a run keeping n of its w ranks -> lo + floor(o * w / n) (o when n == w)
    ranks = lo[..., None] + (offset * width[..., None]).div(
        count[..., None].clamp_min(1), rounding_mode="floor"
    )
    valid = offset < count[..., None]
    ranks = ranks.masked_fill(~valid, 0)
    if rank_to_pos is not None:
        ranks = rank_to_pos.gather(-1, ranks.flatten(1)).view_as(ranks)
    return ranks, valid


def native_bias(score_bias: BiasFn | None) -> bool:
    """Whether the native kernel can add this score bias: none, or ALiBi's form."""
    return score_bias is None or isinstance(score_bias, DistanceBias)


def _check_runs(q: Tensor, k: Tensor, head: Tensor, lo: Tensor, count: Tensor, width: Tensor,
                rank_to_pos: Tensor | None) -> None:
    b, h, t_q, _ = q.shape
    t_k = k.shape[-2]
    if head.dim() != 3 or head.shape[:2] != (b, t_q):
        raise ValueError(f"cell_head must be [B, Tq, C] = [{b}, {t_q}, C], got "
                         f"{tuple(head.shape)}")
    for name, x in (("cell_lo", lo), ("cell_count", count), ("cell_width", width)):
        if x.shape != head.shape or x.dtype.is_floating_point:
            raise ValueError(f"{name} must be an integer tensor shaped like cell_head "
                             f"{tuple(head.shape)}, got {x.dtype} {tuple(x.shape)}")
    if rank_to_pos is not None and rank_to_pos.shape != (b, t_k):
        raise ValueError(f"rank_to_pos must be [B, Tk] = [{b}, {t_k}], got "
                         f"{tuple(rank_to_pos.shape)}")
    if not head.numel():
        return
    used = count > 0
    if int(head.min()) < 0 or int(head.max()) >= h:
        raise ValueError(f"cell_head must lie in [0, {h}) (H = {h})")
    if bool((count < 0).any() | (count > width).any()):
        raise ValueError("cell_count must lie in [0, cell_width]")
    if used.any() and (int(lo[used].min()) < 0 or int((lo + width)[used].max()) > t_k):
        raise ValueError(f"runs must lie within the {t_k} keys: lo >= 0 and lo + width <= Tk")


def run_attention(
    q: Tensor, k: Tensor, v: Tensor, cell_head: Tensor, cell_lo: Tensor, cell_count: Tensor,
    cell_width: Tensor, *, scale: float, row_scale: Tensor | None = None,
    rank_to_pos: Tensor | None = None, query_chunk: int | None = None, validate: bool = True,
    score_bias: BiasFn | None = None, activation: str = "softmax", sigmoid_bias: float = 0.0,
) -> Tensor:
    """Exact attention of each query row over its runs' keys, per head.

    Same result as :func:`~attnlab.ops.sparse_attention.cell_attention` on the expanded runs
    (:func:`run_keys`): per (row, head) a softmax over the keys of that head's runs, times
    ``row_scale``; a head without keys outputs 0. Precondition: no key twice within one
    (row, head).

    Args:
        q: ``[B, H, Tq, D]``; k: ``[B, Hk, Tk, D]``; v: ``[B, Hk, Tk, Dv]`` (``Hk`` divides
            ``H``; query head h reads key/value head ``h // (H // Hk)``).
        cell_head, cell_lo, cell_count, cell_width: integer ``[B, Tq, C]``: each run's query
            head, first rank, kept keys (0 = unused slot) and width in ranks.
        row_scale: ``[B, H, Tq]`` multiplier of the probabilities, or None.
        rank_to_pos: ``[B, Tk]`` key position of each rank, or None (rank = position).
        query_chunk: rows per chunk of the PyTorch path (see ``cell_attention``).
        validate: check the runs (shapes, ranges: a few passes over them); a caller that built
            them itself, like the SEA core, may skip this.
        score_bias: additive bias over (batch, head, query row, key position), evaluated at
            the runs' keys (see ``cell_attention``; the native kernel takes a
            :class:`~attnlab.ops.attention.bias.DistanceBias` only); or None.
        activation, sigmoid_bias: the score activation (the native kernel computes
            ``softmax`` only).
    Returns:
        ``[B, H, Tq, Dv]`` in q's dtype.
    Raises:
        ValueError: inconsistent shapes or runs outside the keys (when ``validate``).
    """
    if validate:
        _check_runs(q, k, cell_head, cell_lo, cell_count, cell_width, rank_to_pos)
    tensors = [q, k, v] + ([] if row_scale is None else [row_scale])
    if executor_for("auto", *tensors, biased=not native_bias(score_bias),
                    native_fits=activation == "softmax", flex_fits=False) == "native":
        return native.run_attention_native(
            q, k, v, cell_head, cell_lo, cell_count, cell_width, scale=scale,
            row_scale=row_scale, rank_to_pos=rank_to_pos, distance=score_bias,
        )
    index, valid = run_keys(cell_lo, cell_width, cell_count, rank_to_pos)
    return cell_attention(q, k, v, cell_head, index, valid, scale=scale, row_scale=row_scale,
                          query_chunk=query_chunk, score_bias=score_bias,
                          activation=activation, sigmoid_bias=sigmoid_bias)


def run_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, cell_head: Tensor, cell_lo: Tensor, cell_count: Tensor,
    cell_width: Tensor, *, scale: float, row_scale: Tensor | None = None,
    rank_to_pos: Tensor | None = None, score_bias: BiasFn | None = None,
    activation: str = "softmax", sigmoid_bias: float = 0.0,
) -> Tensor:
    """Reference of :func:`run_attention`: the runs' dense mask and masked attention."""
    _check_runs(q, k, cell_head, cell_lo, cell_count, cell_width, rank_to_pos)
    index, valid = run_keys(cell_lo, cell_width, cell_count, rank_to_pos)
    return cell_attention_naive(q, k, v, cell_head, index, valid, scale=scale,
                                row_scale=row_scale, score_bias=score_bias,
                                activation=activation, sigmoid_bias=sigmoid_bias)


def _example(gen: torch.Generator, *, hk: int = 2, t: int = 16, runs: int = 4,
             mapped: bool = True, row_scale: bool = True, biased: bool = False,
             symmetric: bool = False, activation: str = "softmax") -> contract.Example:
    """Batch 2, 4 query heads; per row ``runs`` disjoint runs of ranks on random heads (some
    thinned, some unused), row 2 with no key; ``mapped``: ranks map to a random permutation
    of the positions; ``biased``: ALiBi's distance penalty."""
    b, h = 2, 4
    qkv = contract.attention_inputs(gen, b=b, h=h, hk=hk, t_q=t, t_k=t)
    width = torch.randint(1, max(2, t // runs), (b, t, runs), generator=gen)
    lo = (width + torch.randint(0, 2, (b, t, runs), generator=gen)).cumsum(-1) - width
    fits = lo + width <= t
    count = torch.where(torch.rand(b, t, runs, generator=gen) < 0.3, (width + 1) // 2, width)
    count = torch.where(fits & (torch.rand(b, t, runs, generator=gen) < 0.85), count, 0)
    count[:, min(2, t - 1)] = 0
    positions = torch.arange(t, dtype=torch.float64)
    return contract.Example(
        {**qkv, "cell_head": torch.randint(0, h, (b, t, runs), generator=gen),
         "cell_lo": lo.masked_fill(~fits, 0), "cell_count": count,
         "cell_width": width.masked_fill(~fits, 1), "scale": 0.4, "activation": activation,
         "sigmoid_bias": -1.5,
         "rank_to_pos": torch.stack([torch.randperm(t, generator=gen) for _ in range(b)])
         if mapped else None,
         "row_scale": torch.rand(b, h, t, generator=gen, dtype=torch.float64)
         if row_scale else None,
         "score_bias": DistanceBias(torch.rand(h, generator=gen, dtype=torch.float64),
                                    positions, positions, symmetric) if biased else None},
        contract.attention_shape(qkv), options={"query_chunk": 5})


contract.register(contract.OpContract(
    "run_attention", run_attention, run_attention_naive, _example,
    cases=(
        *contract.grid(hk=(4, 2, 1), mapped=(True, False)),
        *contract.grid(label="alibi", biased=(True,), symmetric=(False, True)),
        *contract.grid(activation=("softmax1", "sigmoid"), row_scale=(False,)),
        contract.Case("long-runs", {"t": 24, "runs": 2}),
        contract.Case("one-query-one-key", {"t": 1, "runs": 1}),
    ),
    grads=("q", "k", "v", "row_scale"),
    low_precision=contract.FLOAT32_BFLOAT16,
))
