"""Random feature maps for Performer / FAVOR+ linear attention.

``proj`` is always ``[m, D]`` (one random direction per row) and feature tensors are
``[..., T, m]``. All maps compute in at least float32: lower-precision inputs are upcast.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype feature maps and sums run in: ``dtype`` promoted to at least float32."""
    return torch.promote_types(dtype, torch.float32)


def orthogonal_gaussian(
    n_features: int,
    dim: int,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Orthogonal random features (ORF) for FAVOR+: ``[n_features, dim]``.

    Rows come in blocks of ``dim`` mutually orthogonal unit directions (QR of a Gaussian
    matrix, sign-corrected so each block is Haar-distributed); the last block is truncated.
    Each row is then rescaled by the norm of an independent ``N(0, I_dim)`` vector, i.e. a
    chi(``dim``) length, so every row is marginally ``N(0, I_dim)`` (unbiased softmax kernel)
    while rows within a block stay exactly orthogonal (lower variance).
    """
    if n_features < 1 or dim < 1:
        raise ValueError(f"n_features and dim must be positive, got {n_features}, {dim}")
    kwargs = {"generator": generator, "device": device, "dtype": torch.float64}
    n_blocks = math.ceil(n_features / dim)
    gauss = torch.randn(n_blocks, dim, dim, **kwargs)
    ortho, upper = torch.linalg.qr(gauss)
    ortho = ortho * torch.sign(torch.diagonal(upper, dim1=-2, dim2=-1)).unsqueeze(-2)
    rows = ortho.transpose(-1, -2).reshape(n_blocks * dim, dim)[:n_features]
    lengths = torch.randn(n_features, dim, **kwargs).norm(dim=-1, keepdim=True)
    return (rows * lengths).to(dtype)


def softmax_feature_logits(x: Tensor, proj: Tensor) -> Tensor:
    """``w_r . x - |x|^2 / 2`` for every feature ``r``: the log of the unnormalised positive
    random features, ``[..., T, m]`` in :func:`compute_dtype`."""
    dt = compute_dtype(x.dtype)
    x = x.to(dt)
    return x @ proj.to(dt).transpose(-1, -2) - 0.5 * x.pow(2).sum(-1, keepdim=True)


def softmax_features(
    x: Tensor, proj: Tensor, is_query: bool, valid: Tensor | None = None
) -> Tensor:
    """Positive random features ``exp(w . x - |x|^2/2 - c) / sqrt(m)`` (FAVOR+ softmax kernel).

    ``E[phi(q) . phi(k)] = exp(q . k) * exp(-c_q - c_k)``; the stabilisers ``c`` cancel in the
    attention ratio as long as ``c`` is one constant across all keys a query sees:

    * queries: ``c`` is the max over the row's own features (per query);
    * keys: ``c`` is the max over all valid keys and features of each ``[..., T, m]`` slice
      (global). That uses every key, so it is only for non-causal attention or references;
      the causal fast path uses a running-max stabiliser instead (see ``performer_attention``).

    The stabiliser is detached: the attention output does not depend on it.

    Args:
        x: ``[..., T, D]`` (already scaled by ``sqrt(scale)``). proj: ``[m, D]``.
        valid: ``[..., T]`` bool, True = real row; False rows get all-zero features and are
            left out of the key stabiliser.
    Returns:
        ``[..., T, m]`` in :func:`compute_dtype`.
    """
    logits = softmax_feature_logits(x, proj)
    if valid is not None:
        logits = logits.masked_fill(~valid.unsqueeze(-1), float("-inf"))
    dims = (-1,) if is_query else (-2, -1)
    stab = logits.detach().amax(dim=dims, keepdim=True)
    stab = stab.masked_fill(~torch.isfinite(stab), 0.0)  # no valid row at all
    return torch.exp(logits - stab) / math.sqrt(proj.shape[0])


def relu_features(
    x: Tensor, proj: Tensor, eps: float = 1e-3, valid: Tensor | None = None
) -> Tensor:
    """Generalised-attention features ``ReLU(x W^T) + eps`` (the kernel SEA's OPT path uses).

    Args:
        x: ``[..., T, D]``. proj: ``[m, D]``.
        valid: ``[..., T]`` bool, True = real row; False rows get all-zero features.
    Returns:
        ``[..., T, m]`` in :func:`compute_dtype`.
    """
    dt = compute_dtype(x.dtype)
    feats = torch.relu(x.to(dt) @ proj.to(dt).transpose(-1, -2)) + eps
    if valid is not None:
        feats = feats * valid.unsqueeze(-1)
    return feats


def feature_map(
    x: Tensor, proj: Tensor, kernel: str, *, is_query: bool, valid: Tensor | None = None
) -> Tensor:
    """:func:`softmax_features` (with its query / global-key stabiliser) or :func:`relu_features`
    by ``kernel`` name."""
    if kernel == "relu":
        return relu_features(x, proj, valid=valid)
    return softmax_features(x, proj, is_query=is_query, valid=valid)


def safe_ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num / den[..., None]`` with an empty denominator (no visible key, ``den == 0``) replaced
    by 1, so such rows give exactly 0 with finite gradients (a tiny-epsilon clamp would make the
    gradient of ``num`` overflow)."""
    return num / torch.where(den > 0, den, torch.ones_like(den)).unsqueeze(-1)


def check_kernel(kernel: str) -> None:
    """Raise ``ValueError`` unless ``kernel`` is ``"softmax"`` or ``"relu"``."""
    if kernel not in ("softmax", "relu"):
        raise ValueError(f"kernel must be 'softmax' or 'relu', got {kernel!r}")


def scaled_qk(q: Tensor, k: Tensor, scale: float | None) -> tuple[Tensor, Tensor]:
    """Upcast ``q``, ``k`` to :func:`compute_dtype` and multiply each by ``sqrt(scale)``
    (default ``scale = D^-0.5``), so the kernel estimates ``exp(scale * q . k)``."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    root = math.sqrt(scale)
    dt = compute_dtype(q.dtype)
    return q.to(dt) * root, k.to(dt) * root
