"""Performer (FAVOR+) linear attention: kv sums (bidirectional) or chunked prefix sums (causal).

Causal stabiliser. The FAVOR+ key features need a stabiliser ``c`` (``exp(logit - c)``) that
is the same for every key a query sums over, otherwise the estimate is biased; the usual
global max over all keys would make early outputs depend (numerically) on future tokens. The
causal path instead gives key ``j`` the running max ``M_j = max_{j' <= j} max_r logit_{j'r}``
and rescales exactly: query ``i`` weights key ``j <= i`` by ``phi_j * exp(M_j - M_i)``, i.e.
every key seen by query ``i`` is referred to the common stabiliser ``M_i``. All exponents are
``<= 0`` (no overflow), ``M`` only depends on past keys, and the carried state is kept relative
to the stabiliser of the last key processed (online-softmax style rescaling). Changing a
future token therefore leaves earlier outputs bitwise unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.performer.features import (
    check_kernel,
    feature_map,
    orthogonal_gaussian,
    safe_ratio,
    scaled_qk,
    softmax_feature_logits,
)
from attnlab.ops.performer.naive import performer_attention_naive


class PerformerState(NamedTuple):
    """Causal decoding state after the tokens processed so far.

    ``kv``: ``[B, Hk, m, Dv]`` sum of ``phi(k_j) v_j^T``; ``k_sum``: ``[B, Hk, m]`` sum of
    ``phi(k_j)``; ``stabiliser``: ``[B, Hk]`` log-scale both sums are relative to (the running
    key stabiliser of the softmax kernel; constant 0 for the ReLU kernel). ``Hk`` is the number
    of key/value heads.
    """

    kv: Tensor
    k_sum: Tensor
    stabiliser: Tensor


def _initial_state(phi_q: Tensor, dim_v: int, kernel: str, n_kv: int) -> PerformerState:
    b, m = phi_q.shape[0], phi_q.shape[-1]
    start = torch.finfo(phi_q.dtype).min if kernel == "softmax" else 0.0
    return PerformerState(
        phi_q.new_zeros(b, n_kv, m, dim_v),
        phi_q.new_zeros(b, n_kv, m),
        phi_q.new_full((b, n_kv), start),
    )


def _causal_key_features(
    ks: Tensor, proj: Tensor, valid: Tensor | None, state_stab: Tensor
) -> tuple[Tensor, Tensor]:
    """Key features with the running-max stabiliser: ``(phi_k [B,Hk,T,m], M [B,Hk,T])``."""
    logits = softmax_feature_logits(ks, proj)
    row_max = logits.detach().amax(-1)
    if valid is not None:
        row_max = row_max.masked_fill(~valid, torch.finfo(logits.dtype).min)
    running = torch.maximum(torch.cummax(row_max, dim=-1).values, state_stab.unsqueeze(-1))
    shifted = logits - running.unsqueeze(-1)
    if valid is not None:
        shifted = shifted.masked_fill(~valid.unsqueeze(-1), float("-inf"))
    return torch.exp(shifted) / proj.shape[0] ** 0.5, running


def _causal_stabilised(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    running: Tensor,
    state: PerformerState,
    chunk_size: int,
) -> tuple[Tensor, Tensor, PerformerState]:
    """Causal numerator ``[B,Hk,G,T,Dv]`` and denominator ``[B,Hk,G,T]`` for features with a
    running stabiliser (softmax kernel), chunk by chunk.

    Inside a chunk a ``chunk x chunk`` masked product; across chunks the carried ``state``.
    ``running`` ``[B,Hk,T]`` is the log-scale each key's features are relative to.
    """
    kv, k_sum, stab = state
    nums, dens = [], []
    for start in range(0, phi_k.shape[-2], chunk_size):
        sl = slice(start, start + chunk_size)
        fq, fk, vc, mc = phi_q[..., sl, :], phi_k[:, :, sl], v[:, :, sl], running[:, :, sl]
        tril = torch.ones(fk.shape[-2], fk.shape[-2], dtype=torch.bool, device=fk.device).tril()
        # decay[i, j] = exp(M_j - M_i) refers key j to query i's scale; 0 for future keys
        decay = torch.exp((mc.unsqueeze(-2) - mc.unsqueeze(-1)).masked_fill(~tril, -torch.inf))
        carry = torch.exp(stab.unsqueeze(-1) - mc).unsqueeze(2)  # state -> M_i: [B,Hk,1,c]
        scores = torch.einsum("bhgim,bhjm->bhgij", fq, fk) * decay.unsqueeze(2)
        nums.append(
            scores @ vc.unsqueeze(2)
            + carry.unsqueeze(-1) * torch.einsum("bhgim,bhmd->bhgid", fq, kv)
        )
        dens.append(scores.sum(-1) + carry * torch.einsum("bhgim,bhm->bhgi", fq, k_sum))
        # carry everything over relative to the chunk's last key scale
        last = mc[..., -1]
        fk_last = fk * torch.exp(mc - last.unsqueeze(-1)).unsqueeze(-1)
        shrink = torch.exp(stab - last)
        kv = kv * shrink[..., None, None] + fk_last.transpose(-1, -2) @ vc
        k_sum = k_sum * shrink.unsqueeze(-1) + fk_last.sum(-2)
        stab = last
    return torch.cat(nums, dim=-2), torch.cat(dens, dim=-1), PerformerState(kv, k_sum, stab)


def _causal_plain(
    phi_q: Tensor, phi_k: Tensor, v: Tensor, state: PerformerState, chunk_size: int
) -> tuple[Tensor, Tensor, PerformerState]:
    """:func:`_causal_stabilised` for features without a stabiliser (ReLU kernel), all chunks
    at once: a masked ``chunk x chunk`` product per chunk plus exclusive prefix sums of the
    chunks' ``phi(k)^T v`` (``[B,Hk,T/chunk,m,Dv]``), so no Python loop runs over T."""
    kv, k_sum, stab = state
    b, hk, g, t, m = phi_q.shape
    if t == 1:  # a decoding step: the sums take the new key, the query reads them
        kv = torch.baddbmm(kv.flatten(0, 1), phi_k.flatten(0, 1).transpose(-1, -2),
                           v.flatten(0, 1)).view_as(kv)
        k_sum = k_sum + phi_k[:, :, 0]
        fq = phi_q.squeeze(3)  # [B, Hk, G, m]
        num = (fq @ kv).unsqueeze(3)
        den = fq @ k_sum.unsqueeze(-1)  # [B, Hk, G, 1]
        return num, den, PerformerState(kv, k_sum, stab)
    c = min(chunk_size, t)
    n = -(-t // c)
    pad = n * c - t  # zero rows: zero features and values, after every real key

    def chunks(x: Tensor, lead: int) -> Tensor:  # [..., T, w] -> [..., n, c, w]
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(*x.shape[:lead], n, c, x.shape[-1])

    fq, fk, vc = chunks(phi_q, 3), chunks(phi_k, 2), chunks(v, 2)
    scores = torch.einsum("bhgnim,bhnjm->bhgnij", fq, fk).tril_()  # in place: few T-size temps
    chunk_kv = fk.transpose(-1, -2) @ vc  # [B, Hk, n, m, Dv]
    chunk_ks = fk.sum(-2)  # [B, Hk, n, m]
    past_kv = torch.cat((kv.unsqueeze(2), chunk_kv[:, :, :-1]), 2).cumsum_(2)
    past_ks = torch.cat((k_sum.unsqueeze(2), chunk_ks[:, :, :-1]), 2).cumsum_(2)
    num = (scores @ vc.unsqueeze(2)).add_(fq @ past_kv.unsqueeze(2))
    den = scores.sum(-1).add_(torch.einsum("bhgnim,bhnm->bhgni", fq, past_ks))
    state = PerformerState(past_kv[:, :, -1] + chunk_kv[:, :, -1],
                           past_ks[:, :, -1] + chunk_ks[:, :, -1], stab)
    return (num.reshape(b, hk, g, n * c, -1)[..., :t, :],
            den.reshape(b, hk, g, n * c)[..., :t], state)


def performer_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    proj: Tensor,
    *,
    kernel: str = "softmax",
    causal: bool,
    scale: float | None = None,
    key_padding_mask: Tensor | None = None,
    chunk_size: int = 128,
    state: PerformerState | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, PerformerState]:
    """Performer linear attention ``phi(q) sum_j phi(k_j) v_j^T / phi(q) sum_j phi(k_j)``.

    * ``causal=False``: the kv sums over all keys, O(T m Dv) time, O(m Dv) extra memory.
    * ``causal=True``: chunked prefix sums. Each chunk of ``chunk_size`` queries takes a
      ``chunk x chunk`` masked product with its own keys plus the carried state from earlier
      chunks, so memory is linear in T (no per-token ``m x Dv`` prefix tensor). With ``state``
      the call continues a sequence: feeding tokens in any split (e.g. one at a time) gives the
      same outputs as one full pass.

    Everything runs in at least float32 (the feature maps, sums and division); the output is
    cast back to ``q.dtype``.

    Args:
        q: ``[B, H, T, D]``; k: ``[B, Hk, T, D]``; v: ``[B, Hk, T, Dv]`` (``Hk`` divides ``H``;
            query head ``h`` uses key/value head ``h // (H // Hk)``). Non-causal attention
            allows ``Tq != Tk``; causal needs ``Tq == Tk`` (the new tokens; earlier ones are in
            ``state``).
        proj: ``[m, D]`` random features, e.g. :func:`orthogonal_gaussian`.
        kernel: ``"softmax"`` (FAVOR+ positive features, estimates softmax attention) or
            ``"relu"`` (generalised kernel ``ReLU(x W^T) + 1e-3``).
        scale: the kernel estimates ``exp(scale * q . k)``; default ``D^-0.5``. Applied as
            ``sqrt(scale)`` on both q and k before the feature map.
        key_padding_mask: ``[B, Tk]`` bool, True = real key, False = padding (contributes
            nothing).
        chunk_size: causal chunk length.
        state: causal only: the :class:`PerformerState` returned by the previous call.
        return_state: causal only: also return the state after these tokens.
    Returns:
        ``[B, H, Tq, Dv]`` in ``q.dtype`` (and the new state when ``return_state``). A query
        with no visible key (zero denominator) outputs zeros; see :func:`safe_ratio`.
    """
    check_kernel(kernel)
    b, n_heads, t_q, dim = q.shape
    hk, t_k = k.shape[1], k.shape[-2]
    if n_heads % hk or v.shape[1] != hk or v.shape[-2] != t_k or k.shape[-1] != dim:
        raise ValueError(
            f"inconsistent shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if not causal and (state is not None or return_state):
        raise ValueError("state / return_state are only meaningful for causal attention")
    if causal and t_q != t_k:
        raise ValueError(f"causal Performer needs Tq == Tk, got {t_q} and {t_k}")
    groups = n_heads // hk
    qs, ks = scaled_qk(q, k, scale)
    qs = qs.view(b, hk, groups, t_q, dim)
    vs = v.to(qs.dtype)
    valid = None if key_padding_mask is None else key_padding_mask[:, None, :].expand(b, hk, t_k)
    phi_q = feature_map(qs, proj, kernel, is_query=True)
    if causal:
        if state is None:
            state = _initial_state(phi_q, v.shape[-1], kernel, hk)
        if kernel == "softmax":
            phi_k, running = _causal_key_features(ks, proj, valid, state.stabiliser)
            num, den, state = _causal_stabilised(phi_q, phi_k, vs, running, state, chunk_size)
        else:
            phi_k = feature_map(ks, proj, kernel, is_query=False, valid=valid)
            num, den, state = _causal_plain(phi_q, phi_k, vs, state, chunk_size)
    else:
        phi_k = feature_map(ks, proj, kernel, is_query=False, valid=valid)
        num = torch.einsum("bhgim,bhmd->bhgid", phi_q, phi_k.transpose(-1, -2) @ vs)
        den = torch.einsum("bhgim,bhm->bhgi", phi_q, phi_k.sum(-2))
    out = safe_ratio(num, den).reshape(b, n_heads, t_q, v.shape[-1]).to(q.dtype)
    return (out, state) if return_state else out


def _example(gen: torch.Generator, *, kernel: str = "softmax", causal: bool = True,
             t_q: int = 45, t_k: int = 45, hk: int = 2) -> contract.Example:
    """Batch 2, 4 query heads, 24 orthogonal random features, about 1 key in 5 padded,
    chunks of 16 tokens (45 is not a multiple)."""
    qkv = contract.attention_inputs(gen, hk=hk, t_q=t_q, t_k=t_k)
    return contract.Example(
        {**qkv, "proj": orthogonal_gaussian(24, 8, generator=gen, dtype=torch.float64),
         "kernel": kernel, "causal": causal, "scale": 0.4,
         "key_padding_mask": torch.rand(2, t_k, generator=gen) > 0.2},
        contract.attention_shape(qkv), options={"chunk_size": 16})


contract.register(contract.OpContract(
    "performer_attention", performer_attention, performer_attention_naive, _example,
    cases=(
        *contract.grid(kernel=("softmax", "relu"), causal=(True, False)),
        *contract.grid(label="cross", kernel=("softmax", "relu"), causal=(False,), t_q=(9,)),
        contract.Case("heads-equal", {"hk": 4}),
        *contract.grid(label="one-token", kernel=("softmax", "relu"), t_q=(1,), t_k=(1,)),
    ),
    low_precision=contract.FLOAT32_BFLOAT16,
))
