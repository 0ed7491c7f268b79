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
- ``torch``: PyTorch ops in blocks of queries (gathered keys, or a masked score block);
  anything, gradients and score biases included.

``auto`` picks ``native`` where it serves, else ``flex`` on a GPU for a prefill (at least
:data:`COMPILE_MIN_QUERIES` rows) without a score bias,
else ``torch``. A named executor is honoured where it can run and refused with an error
naming what would run where it cannot; ``native`` falls back to ``torch`` only for what the
kernel does not compute (gradients, other dtypes), which gives the same result.
"""

from __future__ import annotations

from torch import Tensor

from attnlab.ops.sparse_attention import native

EXECUTORS = ("auto", "native", "flex", "torch")
COMPILE_MIN_QUERIES = 64
"""Fewer query rows (a decoding step, whose key count changes every step) run
FlexAttention's eager form, and ``auto`` does not pick ``flex`` for them."""


def check_executor(name: str) -> None:
    """Refuse an executor name that is not one of :data:`EXECUTORS`."""
    if name not in EXECUTORS:
        raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")


def executor_for(requested: str, q: Tensor, k: Tensor, v: Tensor, *others: Tensor,
                 biased: bool = False, native_fits: bool = True, flex_fits: bool = True
                 ) -> str:
    """The executor (``native``, ``flex`` or ``torch``) that runs attention over a selection
    for q ``[B, H, Tq, D]``, k, v ``[B, Hk, Tk, D]`` and the call's ``others`` tensors (a
    ranking, a row scale: the native kernel reads them too), given the ``requested`` one
    (module docstring). What the selector offers for this call: ``native_fits`` (its native
    path serves it, its score bias included), ``flex_fits`` (it has a FlexAttention path);
    ``biased``: a score bias neither fused path takes.

    Raises:
        ValueError: an unknown name, ``native`` off the CPU, or ``flex`` where the selector
            has no FlexAttention path or with a score bias.
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
    if requested in ("flex", "torch"):
        return requested
    fits_native = native_fits and not biased and native.supports(q, k, v, *others)
    if requested == "native" or fits_native:
        return "native" if fits_native else "torch"
    if flex_fits and device != "cpu" and not biased and q.shape[-2] >= COMPILE_MIN_QUERIES:
        return "flex"
    return "torch"
