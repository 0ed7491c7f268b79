"""What a SEA call knows about its keys, and what causal decoding carries between calls.

A call's keys are addressed by *rank* among the real (unpadded) keys. Without a decoding state
the ranks come from the whole key-padding mask; with one, the state's count of real keys
carries them, so a decoding step reads only its new keys' mask: O(1) in the cache length.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from attnlab.layers.sea.estimator import EstimatorState
from attnlab.ops.attention.masks import rank_positions


@dataclasses.dataclass
class SEAState:
    """Causal decoding state after ``n_tokens`` key positions.

    ``estimator``: the estimator's carry; ``n_real`` ``[B]``: real keys so far;
    ``value_sum`` ``[B, Hk, Dv]`` (at least float32): the sum of their values (the average
    context's numerator). Its size does not depend on ``n_tokens``.
    """

    estimator: EstimatorState
    n_real: Tensor
    value_sum: Tensor
    n_tokens: int


@dataclasses.dataclass
class KeyLayout:
    """Ranks and visible keys of one call (queries are the last ``Tq`` of ``Tk`` keys).

    ``key_ranks`` ``[B or 1, n]``: the rank of each key the estimator reads (all ``Tk``, or
    the ``Tq`` new ones when decoding from a state); ``n_real`` ``[B]``: real keys in all;
    ``lengths`` ``[B, Tq]``: keys visible to each query row (``L_t``); ``rank_to_pos``
    ``[B, Tk]``: the key position of each rank (None = the identity, no padding).
    """

    key_ranks: Tensor
    n_real: Tensor
    lengths: Tensor
    rank_to_pos: Tensor | None


def key_layout(key_mask: Tensor | None, b: int, t_q: int, t_k: int, *, causal: bool,
               state: SEAState | None, device: torch.device) -> KeyLayout:
    """The :class:`KeyLayout` of a call with ``key_mask`` ``[B, Tk]`` (True = real key) or
    None; ``state``: a usable decoding state made after the first ``Tk - Tq`` keys, or None."""
    first = t_k - t_q if state is not None else 0
    if key_mask is None:
        positions = torch.arange(first, t_k, device=device)
        lengths = (positions[-t_q:] + 1 if causal
                   else torch.full((t_q,), t_k, device=device)).expand(b, t_q)
        n_real = torch.full((b,), t_k, device=device)
        return KeyLayout(positions[None], n_real, lengths, None)
    counts = key_mask[:, first:].long().cumsum(-1)
    if state is not None:
        counts = counts + state.n_real[:, None]
    lengths = counts[:, -t_q:] if causal else counts[:, -1:].expand(b, t_q)
    return KeyLayout((counts - 1).clamp_min(0), counts[:, -1], lengths,
                     rank_positions(key_mask))
