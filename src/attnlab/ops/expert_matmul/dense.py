"""All-experts expert matmul (the "dense" backend): a few big GEMMs instead of a sort.

Every row is multiplied by every expert and the gates pick the results, so it does
``dense_macs / useful_macs`` = ``E / (G * k)`` times the useful work (``E / k`` for per-group
input with reduce "slots"/"none"), in return for no sort, gather or scatter. Where the reduction
allows it, the gate is applied to the *input* instead (``[N, E * K_in] @ W.reshape(E * K_in,
K_out)``), so the all-experts product is never formed.

The backward is plain autograd. What it saves is at most one all-experts tensor: the
``[N(*G), E, K_out]`` product for "slots"/"none", or the gate-scaled ``[N, E, K_in]`` input for
"all", i.e. ``dense_macs / useful_macs`` times the ``[M, K]`` size of the grouped path; the
``auto`` rule only picks this backend where that ratio is small.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.expert_matmul.layout import Layout


def dense_mac_ratio(layout: Layout) -> float:
    """MACs of the dense backend divided by the useful MACs ``N * G * k * K_in * K_out``."""
    copies = layout.groups if layout.per_group_input and layout.reduce != "all" else 1
    return copies * layout.experts / max(layout.groups * layout.k, 1)


def _coefficients(sel: Tensor, gate: Tensor | None, layout: Layout, dtype: torch.dtype) -> Tensor:
    """``coef[n, g, e]`` = summed gate of the slots of (n, g) that chose expert e: ``[N, G, E]``."""
    src = torch.ones(sel.shape, dtype=dtype, device=sel.device) if gate is None else gate
    zeros = torch.zeros(layout.n, layout.groups, layout.experts, dtype=dtype, device=sel.device)
    return zeros.scatter_add(2, sel, src)


def dense_expert_matmul(
    x: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None, layout: Layout
) -> Tensor:
    """All-experts path; arguments already validated. Returns ``layout.out_shape``."""
    n, e, k_in, k_out = layout.n, layout.experts, layout.k_in, layout.k_out
    sel = sel.long()
    if layout.reduce == "all":
        coef = _coefficients(sel, gate, layout, x.dtype)
        if layout.per_group_input:  # z[n, e] = sum_g coef[n, g, e] * x[n, g]
            scaled = torch.bmm(coef.transpose(1, 2), x)
        else:
            scaled = coef.sum(dim=1).unsqueeze(2) * x.unsqueeze(1)
        return scaled.reshape(n, e * k_in) @ weight.reshape(e * k_in, k_out)

    rows = x.reshape(-1, k_in)  # [N, K_in] or [N * G, K_in]
    products = (rows @ weight.permute(1, 0, 2).reshape(k_in, e * k_out)).view(-1, e, k_out)
    if layout.reduce == "slots":
        coef = _coefficients(sel, gate, layout, x.dtype)
        if layout.per_group_input:
            coef = coef.view(-1, 1, e)
        return torch.bmm(coef, products).view(layout.out_shape)

    input_groups = layout.groups if layout.per_group_input else 1
    row_of_group = torch.arange(products.shape[0], device=x.device).view(n, input_groups, 1)
    picked = products.reshape(-1, k_out)[(row_of_group * e + sel).reshape(-1)]
    out = picked.view(layout.out_shape)
    return out if gate is None else out * gate.unsqueeze(-1)
