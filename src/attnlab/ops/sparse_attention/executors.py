"""Which executor runs a selection's attention: the one place that decides.

A selector (Quest, block top-k, ``sea_pages``: :mod:`attnlab.ops.attention.pages`; the sinks
+ window: :mod:`attnlab.ops.attention.window`; SEA's estimated cells:
:mod:`attnlab.ops.sea.attend`, and runs of keys: :mod:`.runs`, which have no FlexAttention
path) says which keys each query row reads; an executor computes the exact attention over
them:

- ``native``: the native CPU kernel (keys read in place; for the page selectors it also
  scores and selects, in the same call); CPU, float32 / float64 / bfloat16, no autograd, no
  score bias, and only the calls its selector routes there (the window's decoding rows).
- ``flex``: FlexAttention on the selection's block mask
  (:mod:`~attnlab.ops.sparse_attention.flex`); any device, no score bias.
- ``triton``: Triton kernels (:mod:`~attnlab.ops.sparse_attention.triton_pages`): a page
  selector's decoding step (scores, selection, attention) in one kernel, or any page
  selection read as a block table; CUDA (or CPU under ``TRITON_INTERPRET=1``, for tests),
  no gradients, no score bias; page selectors only.
- ``torch``: PyTorch ops in blocks of queries (gathered keys, or a masked score block);
  anything, gradients and score biases included.

``auto`` picks ``native`` where it serves, else on a GPU without a score bias ``flex`` for a
prefill (at least :data:`COMPILE_MIN_QUERIES` rows) and ``triton`` for fewer rows (a
decoding step) where triton is installed and no gradient is needed, else ``torch``. A named
executor is honoured where it can run and refused with an error naming what would run where
it cannot; ``native`` falls back to ``torch`` only for what the kernel does not compute
(gradients, other dtypes), which gives the same result.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
from torch import Tensor

from attnlab.ops.sparse_attention import native

EXECUTORS = ("auto", "native", "flex", "triton", "torch")
COMPILE_MIN_QUERIES = 64
"""Fewer query rows (a decoding step, whose key count changes every step) run
FlexAttention's eager form, and ``auto`` does not pick ``flex`` for them."""


def check_executor(name: str, offered: tuple[str, ...] = EXECUTORS) -> None:
    """Refuse an executor name that is not one of :data:`EXECUTORS`, or not one of those a
    selector ``offered``, naming the ones it offers."""
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(offered)}")
    if name not in offered:
        raise ValueError(f"this selector has no {name!r} executor; choose one of "
                         f"{', '.join(offered)}")


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_runs_on(device: str) -> str | None:
    """Why the Triton executor cannot run on ``device`` (None: it can): it needs triton
    installed, and CUDA, or the interpreter on CPU (``TRITON_INTERPRET=1``)."""
    if not _triton_installed():
        return "needs triton (pip install 'attnlab[triton]')"
    if not (device == "cuda" or device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        return f"runs on CUDA, not on {device} (TRITON_INTERPRET=1 interprets it on CPU: slow)"
    return None


def executor_for(requested: str, q: Tensor, k: Tensor, v: Tensor, *others: Tensor,
                 biased: bool = False, native_fits: bool = True, flex_fits: bool = True,
                 triton_fits: bool = False) -> str:
    """The executor (``native``, ``flex``, ``triton`` or ``torch``) that runs attention over
    a selection for q ``[B, H, Tq, D]``, k, v ``[B, Hk, Tk, D]`` and the call's ``others``
    tensors (a ranking, a row scale: the native kernel reads them too), given the
    ``requested`` one (module docstring). What the selector offers for this call:
    ``native_fits`` (its native path serves it, its score bias included), ``flex_fits`` (it
    has a FlexAttention path), ``triton_fits`` (it hands over a page selection); ``biased``:
    a score bias neither fused path takes.

    Raises:
        ValueError: an unknown name, ``native`` off the CPU, ``flex`` or ``triton`` where the
            selector has no such path or with a score bias, ``triton`` where it cannot run
            (:func:`triton_runs_on`) or for a call that needs gradients.
    """
    check_executor(requested)
    device = q.device.type
    if requested == "native" and device != "cpu":
        instead = "'flex', 'torch' or 'auto'" if flex_fits else "'torch' or 'auto'"
        raise ValueError(f"executor 'native' runs on the CPU, not on {device}; use {instead}")
    if requested == "flex" and not flex_fits:
        raise ValueError("this selector has no 'flex' executor; use 'native', 'torch' or "
                         "'auto'")
    if requested == "flex" and biased:
        raise ValueError("executor 'flex' takes no score bias here; use 'torch' or 'auto' "
                         "with a position bias")
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *others))
    if requested == "triton" and (why := _triton_refusal(device, triton_fits, biased, grads)):
        raise ValueError(f"{why}; use 'torch' or 'auto'")
    if requested in ("flex", "triton", "torch"):
        return requested
    fits_native = native_fits and not biased and native.supports(q, k, v, *others)
    if requested == "native" or fits_native:
        return "native" if fits_native else "torch"
    if device == "cpu" or biased:
        return "torch"
    if flex_fits and q.shape[-2] >= COMPILE_MIN_QUERIES:
        return "flex"
    return "torch" if _triton_refusal(device, triton_fits, biased, grads) else "triton"


def _triton_refusal(device: str, fits: bool, biased: bool, grads: bool) -> str | None:
    """Why the Triton executor cannot take a call (None: it can)."""
    if not fits:
        return "this selector has no 'triton' executor"
    if biased:
        return "executor 'triton' takes no score bias here"
    if grads:
        return "executor 'triton' computes no gradients"
    cannot = triton_runs_on(device)
    return None if cannot is None else f"executor 'triton' {cannot}"
