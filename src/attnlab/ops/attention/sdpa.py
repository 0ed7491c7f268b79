"""``torch.nn.functional.scaled_dot_product_attention``: the FlashAttention-class dense path."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.ops import contract
from attnlab.ops.attention.activations import ACTIVATIONS, check_activation
from attnlab.ops.attention.masks import allowed_keys
from attnlab.ops.attention.naive import softmax_attention


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool,
    key_padding_mask: Tensor | None = None,
    score_bias: Tensor | None = None,
    dropout_p: float = 0.0,
    activation: str = "softmax",
    sigmoid_bias: float = 0.0,
) -> Tensor:
    """Same contract as :func:`attnlab.ops.attention.softmax_attention`, through PyTorch SDPA.

    Uses ``is_causal=True`` (the memory-efficient kernels) when there is no cache offset, no
    padding and no bias; otherwise passes an explicit mask or additive bias. ``softmax1`` is
    softmax over one extra key whose score and value are 0 (still SDPA); ``sigmoid`` has no
    SDPA form and runs the explicit reference.
    """
    check_activation(activation)
    if activation == "sigmoid":
        return softmax_attention(
            q, k, v, scale=scale, causal=causal, key_padding_mask=key_padding_mask,
            score_bias=score_bias, dropout_p=dropout_p, activation="sigmoid",
            sigmoid_bias=sigmoid_bias,
        )
    t_q, t_k = q.shape[-2], k.shape[-2]
    gqa = k.shape[1] != q.shape[1]
    if (activation == "softmax" and score_bias is None and key_padding_mask is None
            and (not causal or t_q == t_k)):
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, dropout_p=dropout_p, enable_gqa=gqa
        )
    mask = allowed_keys(t_q, t_k, causal=causal, key_padding_mask=key_padding_mask, device=q.device)
    empty_rows = None
    if activation == "softmax1":
        k, v, mask, score_bias = _with_null_key(k, v, mask, score_bias)
    elif mask is not None:
        empty_rows = ~mask.any(-1, keepdim=True)
        mask = mask | empty_rows  # keep SDPA finite; those rows are zeroed below
    if score_bias is not None:
        attn_mask = score_bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
    else:
        attn_mask = mask
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, scale=scale, dropout_p=dropout_p, enable_gqa=gqa
    )
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return out


def _with_null_key(
    k: Tensor, v: Tensor, mask: Tensor | None, score_bias: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """softmax1 as softmax: a first key with zero key and value (score 0, bias 0) that every
    query may attend to; a row with no real key then attends only to it and outputs 0."""
    k = torch.cat((k.new_zeros(*k.shape[:2], 1, k.shape[-1]), k), dim=-2)
    v = torch.cat((v.new_zeros(*v.shape[:2], 1, v.shape[-1]), v), dim=-2)
    if mask is not None:
        mask = torch.cat((mask.new_ones(*mask.shape[:2], mask.shape[2], 1), mask), dim=-1)
    if score_bias is not None:
        score_bias = F.pad(score_bias, (1, 0))
    return k, v, mask, score_bias


def _example(gen: torch.Generator, *, activation: str = "softmax", causal: bool = True,
             padded: bool = False, biased: bool = False, hk: int = 2, t_q: int = 7,
             t_k: int = 7) -> contract.Example:
    """Batch 2, 4 query heads; padding: a hole, and left padding (rows with no key)."""
    qkv = contract.attention_inputs(gen, hk=hk, t_q=t_q, t_k=t_k)
    padding = contract.padding_mask(2, t_k) if padded else None
    bias = contract.normal(gen, 2, 4, t_q, t_k) if biased else None
    return contract.Example({**qkv, "scale": 0.3, "causal": causal, "activation": activation,
                             "sigmoid_bias": -1.0, "key_padding_mask": padding,
                             "score_bias": bias}, contract.attention_shape(qkv))


contract.register(contract.OpContract(
    "sdpa_attention", sdpa_attention, softmax_attention, _example,
    cases=(
        *contract.grid(activation=ACTIVATIONS, causal=(True, False), padded=(False, True),
                       biased=(False, True), hk=(2, 4)),
        *contract.grid(label="cache", activation=ACTIVATIONS, t_q=(3,), t_k=(9,)),
        contract.Case("one-query-one-key", {"t_q": 1, "t_k": 1}),
    ),
    grads=("q", "k", "v", "score_bias"),
    low_precision=contract.FLOAT32,
))
