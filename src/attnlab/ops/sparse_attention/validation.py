"""Argument checks shared by the sparse-attention reference and fast path."""

from __future__ import annotations

import torch
from torch import Tensor


def check_sparse_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_index: Tensor,
    key_valid: Tensor,
    row_scale: Tensor | None,
) -> None:
    """Raise ``ValueError`` on inconsistent shapes/dtypes or a valid index outside ``[0, Tk)``.

    Shapes: q ``[B, H, Tq, D]``; k ``[B, Hk, Tk, D]``; v ``[B, Hk, Tk, Dv]`` with ``Hk`` dividing
    ``H``; key_index (integer) and key_valid (bool) ``[B, H, Tq, S]``; row_scale ``[B, H, Tq]``.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D [B, heads, T, D]")
    b, h, t_q, d = q.shape
    hk, t_k = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} in B or D")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v {tuple(v.shape)} does not match k {tuple(k.shape)} in B, Hk, Tk")
    if h % hk:
        raise ValueError(f"{h} query heads are not a multiple of {hk} key/value heads")
    if key_index.dim() != 4 or key_index.shape[:3] != (b, h, t_q):
        raise ValueError(
            f"key_index must be [B, H, Tq, S] = [{b}, {h}, {t_q}, S], got {tuple(key_index.shape)}"
        )
    if key_valid.shape != key_index.shape:
        raise ValueError(
            f"key_valid {tuple(key_valid.shape)} must match key_index {tuple(key_index.shape)}"
        )
    if key_index.dtype.is_floating_point or key_index.dtype.is_complex:
        raise ValueError(f"key_index must be an integer tensor, got {key_index.dtype}")
    if key_valid.dtype != torch.bool:
        raise ValueError(f"key_valid must be bool, got {key_valid.dtype}")
    if row_scale is not None and row_scale.shape != (b, h, t_q):
        raise ValueError(
            f"row_scale must be [B, H, Tq] = [{b}, {h}, {t_q}], got {tuple(row_scale.shape)}"
        )
    if key_valid.any():
        # invalid slots are ignored: fill them with a value that is always in range
        lo, hi = (int(x) for x in torch.aminmax(key_index.masked_fill(~key_valid, 0)))
        if lo < 0 or hi >= t_k:
            raise ValueError(
                f"key_index of valid slots must lie in [0, {t_k}) (Tk = {t_k}); "
                f"got values in [{lo}, {hi}]"
            )


def check_cell_inputs(
    q: Tensor, k: Tensor, v: Tensor, cell_head: Tensor, key_index: Tensor, key_valid: Tensor,
    row_scale: Tensor | None,
) -> None:
    """Raise ``ValueError`` on inconsistent shapes/dtypes or out-of-range indices.

    q ``[B, H, Tq, D]``; k ``[B, Hk, Tk, D]``; v ``[B, Hk, Tk, Dv]``; cell_head integer
    ``[B, Tq, C]``; key_index integer and key_valid bool ``[B, Tq, C, W]``; row_scale
    ``[B, H, Tq]`` or None.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D [B, heads, T, D]")
    b, h, t_q, d = q.shape
    hk, t_k = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d or v.shape[:3] != k.shape[:3] or h % hk:
        raise ValueError(f"inconsistent q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if cell_head.dim() != 3 or cell_head.shape[:2] != (b, t_q):
        raise ValueError(f"cell_head must be [B, Tq, C] = [{b}, {t_q}, C], got "
                         f"{tuple(cell_head.shape)}")
    if key_index.dim() != 4 or key_index.shape[:3] != cell_head.shape:
        raise ValueError(f"key_index must be [B, Tq, C, W] with [B, Tq, C] = "
                         f"{tuple(cell_head.shape)}, got {tuple(key_index.shape)}")
    if key_valid.shape != key_index.shape or key_valid.dtype != torch.bool:
        raise ValueError("key_valid must be a bool tensor shaped like key_index")
    if cell_head.dtype.is_floating_point or key_index.dtype.is_floating_point:
        raise ValueError("cell_head and key_index must be integer tensors")
    if row_scale is not None and row_scale.shape != (b, h, t_q):
        raise ValueError(f"row_scale must be [B, H, Tq] = [{b}, {h}, {t_q}], got "
                         f"{tuple(row_scale.shape)}")
    if cell_head.numel() and (int(cell_head.min()) < 0 or int(cell_head.max()) >= h):
        raise ValueError(f"cell_head must lie in [0, {h}) (H = {h})")
    if key_valid.any():
        lo, hi = (int(x) for x in torch.aminmax(key_index.masked_fill(~key_valid, 0)))
        if lo < 0 or hi >= t_k:
            raise ValueError(f"key_index of valid slots must lie in [0, {t_k}); got [{lo}, {hi}]")
