"""Timing and peak memory of benchmark candidates: side by side, rep by rep, so that drift
(thermal, other load) hits every candidate alike."""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

MIN_REPS = 5


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of one candidate, in milliseconds, in the order they were taken."""

    times_ms: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min(self) -> float:
        return min(self.times_ms)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one call of ``fn``, CUDA work synchronised before and after."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def time_side_by_side(
    fns: Mapping[str, Callable[[], object]],
    reps: int | Mapping[str, int] = 10,
    *,
    warmup: int = 1,
    device: torch.device | str = "cpu",
) -> dict[str, Timing]:
    """Time several candidates against each other, round-robin.

    Each candidate first runs ``warmup`` untimed calls. Then round r times every candidate
    that still has reps left, in the given order (a, b, c, a, b, c, ...), so candidates with
    fewer reps (``reps`` may map names to counts, e.g. for a slow reference) drop out of the
    later rounds but are interleaved with the others while they run. At least ``MIN_REPS``
    reps each. CUDA work is synchronised before and after every timed call.
    """
    device = torch.device(device)
    counts = {name: reps if isinstance(reps, int) else reps[name] for name in fns}
    if min(counts.values(), default=MIN_REPS) < MIN_REPS:
        raise ValueError(f"need at least {MIN_REPS} reps per candidate, got {counts}")
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        logger.debug("warmed up %s", name)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rnd in range(max(counts.values(), default=0)):
        for name, fn in fns.items():
            if rnd >= counts[name]:
                continue
            times[name].append(time_call(fn, device))
    return {name: Timing(tuple(ts)) for name, ts in times.items()}


def fwd(fn: Callable[[], Tensor]) -> Callable[[], None]:
    """A forward-only call of ``fn``, as in inference (autograd disabled)."""

    def call() -> None:
        with torch.no_grad():
            fn()

    return call


def fwdbwd(fn: Callable[[], Tensor], inputs: Sequence[Tensor], seed: int = 0) -> Callable[[], None]:
    """Forward, backward of a fixed random upstream gradient, then the grads of ``inputs``
    reset to None (so every call does the same work and nothing accumulates)."""
    upstream: list[Tensor] = []

    def call() -> None:
        out = fn()
        if not upstream:
            gen = torch.Generator(device=out.device).manual_seed(seed)
            grad = torch.randn(out.shape, generator=gen, dtype=out.dtype, device=out.device)
            upstream.append(grad)
        out.backward(upstream[0])
        for t in inputs:
            t.grad = None

    return call


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Silence kineto's "profiler_start/stop" lines on stderr (level 5, the highest) while the
    profiler runs; restores the caller's setting afterwards."""
    old = os.environ.get("KINETO_LOG_LEVEL")
    os.environ["KINETO_LOG_LEVEL"] = "6"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KINETO_LOG_LEVEL", None)
        else:
            os.environ["KINETO_LOG_LEVEL"] = old


def _cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak of live CPU bytes allocated during ``fn()``, relative to before the call.

    Replays every allocation and free the profiler saw (``profile_memory=True``) in time order
    and takes the maximum of the running sum; op-internal workspaces are included.
    """
    from torch.profiler import ProfilerActivity, profile

    with _quiet_kineto(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def peak_memory_mb(fn: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Peak activation/workspace memory of one call of ``fn`` in MiB (2**20 bytes), not
    counting what was allocated before the call. CUDA: ``max_memory_allocated`` after a reset;
    CPU: the profiler's allocation trace (``_cpu_peak_bytes``)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        peak = _cpu_peak_bytes(fn)
    return peak / 2**20
