"""``attnlab bench expert-matmul``: the expert matmul at SwitchHead's paper shapes.

For the V projection (``[N, d_model] -> [N, H, d_head]``, reduce "slots") and the O projection
(``[N, H, d_head] -> [N, d_model]``, reduce "all") it times, side by side in one alternating
run per pass:

* ``fast``: ``expert_matmul`` with ``backend="auto"`` (the backend it picked is logged);
* ``naive``: the gather-einsum reference (fewer reps: it is slow);
* ``dense-equal-macs``: the baseline, one plain matmul doing the same useful MACs
  (V: ``[N, d] @ [d, H*k*d_head]``; O: ``[N, H*k*d_head] @ [H*k*d_head, d]``);
* with ``backends``, each named backend forced (``grouped``, ``dense``, ``triton``), to see
  whether "auto" picks the fastest one on this machine.

Inputs are routed like SwitchHead: per head, sigmoid scores over its E experts, top-k, ids
``h * E + e``, gate = the selected scores.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.ops.expert_matmul import (
    BACKENDS,
    choose_backend,
    expert_matmul,
    expert_matmul_naive,
)
from attnlab.ops.expert_matmul.layout import check_inputs
from attnlab.results import (
    PASSES,
    Record,
    fill_ratios,
    fwd,
    fwdbwd,
    peak_memory_mb,
    time_side_by_side,
    write_json,
)

logger = logging.getLogger(__name__)

BENCH = "expert_matmul"
BASELINE = "dense-equal-macs"
FORCEABLE = tuple(b for b in BACKENDS if b not in ("auto", "naive"))


@dataclass(frozen=True)
class Preset:
    """SwitchHead attention sizes: d_model, heads H, experts per head E, top-k, d_head."""

    d_model: int
    heads: int
    experts: int
    k: int
    d_head: int


PRESETS = {"wt103-47m": Preset(d_model=412, heads=2, experts=5, k=2, d_head=76)}


@dataclass
class _Problem:
    """One projection: the three candidates and the leaves each one differentiates."""

    shape: dict[str, object]
    candidates: dict[str, tuple[Callable[[], Tensor], list[Tensor]]]
    fast_backend: str


def _routing(n: int, p: Preset, gen: torch.Generator, dtype: torch.dtype, device: torch.device):
    """SwitchHead-style ``sel [N, H, k]`` (ids ``h * E + e``) and gate ``[N, H, k]``."""
    scores = torch.rand(n, p.heads, p.experts, generator=gen).to(device)
    top = scores.topk(p.k, dim=-1)
    sel = top.indices + (torch.arange(p.heads, device=device) * p.experts).view(1, -1, 1)
    return sel, top.values.to(dtype)


def _problem(
    projection: str, n: int, p: Preset, dtype: torch.dtype, device: torch.device, seed: int,
    backends: Sequence[str] = (),
) -> _Problem:
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape: int, fan_in: int = 1) -> Tensor:
        t = torch.randn(*shape, generator=gen) / fan_in**0.5
        return t.to(device=device, dtype=dtype).requires_grad_()

    sel, gate = _routing(n, p, gen, dtype, device)
    gate.requires_grad_()
    active = p.heads * p.k * p.d_head
    if projection == "V":
        x, reduce = leaf(n, p.d_model), "slots"
        weight = leaf(p.heads * p.experts, p.d_model, p.d_head, fan_in=p.d_model)
        dense_x, dense_w = x, leaf(p.d_model, active, fan_in=p.d_model)
    else:
        x, reduce = leaf(n, p.heads, p.d_head), "all"
        weight = leaf(p.heads * p.experts, p.d_head, p.d_model, fan_in=p.heads * p.d_head)
        dense_x, dense_w = leaf(n, active), leaf(active, p.d_model, fan_in=active)
    layout = check_inputs(x, weight, sel, gate, reduce, check=True)
    moe_leaves = [x, weight, gate]
    candidates = {
        "fast": (lambda: expert_matmul(x, weight, sel, gate, reduce=reduce), moe_leaves),
        "naive": (lambda: expert_matmul_naive(x, weight, sel, gate, reduce=reduce), moe_leaves),
        BASELINE: (lambda: dense_x @ dense_w, [dense_x, dense_w]),
    }
    for b in backends:
        candidates[b] = (lambda b=b: expert_matmul(x, weight, sel, gate, reduce=reduce,
                                                   backend=b), moe_leaves)
    shape = {"projection": projection, "tokens": n, "d_model": p.d_model, "heads": p.heads,
             "experts": p.experts, "k": p.k, "d_head": p.d_head, "dtype": str(dtype)[6:]}
    return _Problem(shape, candidates, choose_backend(layout, device))


def run(
    tokens: int = 4096,
    preset: str = "wt103-47m",
    passes: Sequence[str] = ("fwd", "fwdbwd"),
    reps: int = 10,
    naive_reps: int = 5,
    json_path: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    backends: Sequence[str] = (),
) -> list[Record]:
    """Benchmark V and O at ``preset`` with ``tokens`` rows, and each of ``backends``
    (:data:`FORCEABLE`) forced; returns the records (ratios against ``dense-equal-macs``
    filled) and writes them to ``json_path`` when given."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
    wrong = [b for b in backends if b not in FORCEABLE]
    if wrong:
        raise ValueError(f"unknown backends {wrong}; valid: {', '.join(FORCEABLE)}")
    unknown = [p for p in passes if p not in PASSES]
    if unknown:
        raise ValueError(f"unknown passes {unknown}; known: {PASSES}")
    dev = torch.device(device)
    records: list[Record] = []
    for projection in ("V", "O"):
        prob = _problem(projection, tokens, PRESETS[preset], dtype, dev, seed, backends)
        logger.info("%s projection: fast = auto backend %r", projection, prob.fast_backend)
        for pass_ in passes:
            calls = {
                name: fwd(f) if pass_ == "fwd" else fwdbwd(f, leaves)
                for name, (f, leaves) in prob.candidates.items()
            }
            counts = {name: naive_reps if name == "naive" else reps for name in calls}
            timings = time_side_by_side(calls, counts, device=dev)
            for name, call in calls.items():
                t = timings[name]
                mem = peak_memory_mb(call, dev)
                records.append(Record(BENCH, name, pass_, prob.shape, t.median, t.min, mem))
                logger.info("%s %s %s: %.2f ms (min %.2f), %.1f MiB",
                            projection, pass_, name, t.median, t.min, mem)
    fill_ratios(records, BASELINE)
    if json_path is not None:
        write_json(json_path, records)
    return records
