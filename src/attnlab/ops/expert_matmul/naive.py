"""Reference expert matmul: gather one weight matrix per slot and contract with einsum.

Obviously correct and memory-hungry (it materialises ``[N, G, k, K_in, K_out]``); the tests and
the benchmark compare every fast path against it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.ops.expert_matmul.layout import check_inputs


def expert_matmul_naive(
    x: Tensor, weight: Tensor, sel: Tensor, gate: Tensor | None = None, *, reduce: str = "slots"
) -> Tensor:
    """``out[n, g, j] = gate[n, g, j] * x[n(, g)] @ weight[sel[n, g, j]]``, then reduced.

    Shapes: x ``[N, K_in]`` or ``[N, G, K_in]``; weight ``[E, K_in, K_out]``; sel, gate
    ``[N, G, k]``. Returns ``[N, G, k, K_out]`` (reduce="none"), ``[N, G, K_out]`` ("slots",
    summed over j) or ``[N, K_out]`` ("all", summed over g and j).
    """
    layout = check_inputs(x, weight, sel, gate, reduce, check=True)
    rows = x if layout.per_group_input else x.unsqueeze(1).expand(-1, layout.groups, -1)
    out = torch.einsum("ngi,ngjio->ngjo", rows, weight[sel.long()])
    if gate is not None:
        out = out * gate.unsqueeze(-1)
    if reduce == "none":
        return out
    return out.sum(dim=2) if reduce == "slots" else out.sum(dim=(1, 2))
