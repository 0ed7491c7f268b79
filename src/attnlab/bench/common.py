"""Benchmark infrastructure shared by every ``attnlab bench`` command.

One JSON schema for all benchmarks::

    {"machine": {"cpu": str, "cores": int, "threads": int, "gpu": str | null, "torch": str},
     "results": [{"bench", "name", "pass": "fwd" | "fwdbwd", "shape": {...}, "ms_median",
                  "ms_min", "peak_mem_mb", "baseline", "ratio"}, ...]}

``ratio`` is ``ms_median`` over the baseline record's ``ms_median`` (same bench, pass and
shape), both measured in the same run by ``time_side_by_side``, which alternates the
candidates rep by rep so that drift (thermal, other load) hits all of them alike.

Optional additions: a result that was not run (e.g. it would not fit in memory) carries
``"skipped": reason`` and ``null`` times, memory and ratio; a file may carry a top-level
``"summary"`` mapping (bench-specific derived values, e.g. scaling slopes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.utils import readers
from attnlab.utils.allocator import cpu_allocator_tuned
from attnlab.utils.io import atomic_write_json
from attnlab.utils.provenance import available_cores

logger = logging.getLogger(__name__)

PASSES = ("fwd", "fwdbwd")
MIN_REPS = 5


def machine_info() -> dict[str, Any]:
    """``{"cpu": model name, "cores": CPU cores this process may use, "threads": torch
    threads, "gpu": CUDA device name or None, "torch": version, "malloc_tuned": whether freed
    memory stays in the heap}`` (see :mod:`attnlab.utils.allocator`)."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": available_cores(), "threads": torch.get_num_threads(),
            "gpu": gpu, "torch": torch.__version__, "malloc_tuned": cpu_allocator_tuned()}


# ---------------------------------------------------------------- timing


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


# ---------------------------------------------------------------- memory


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


# ---------------------------------------------------------------- records


@dataclass
class Record:
    """One benchmark result; ``pass_`` is serialised as ``"pass"``. ``ratio`` is None until
    ``fill_ratios`` sets it. ``skipped``: why the candidate was not run (its times, memory and
    ratio are then None); omitted from the JSON when None."""

    bench: str
    name: str
    pass_: str
    shape: dict[str, Any]
    ms_median: float | None
    ms_min: float | None
    peak_mem_mb: float | None
    baseline: str = ""
    ratio: float | None = None
    skipped: str | None = None

    def __post_init__(self) -> None:
        if self.pass_ not in PASSES:
            raise ValueError(f"pass must be one of {PASSES}, got {self.pass_!r}")

    def to_json(self) -> dict[str, Any]:
        """The schema's dict for one result."""
        data = asdict(self)
        data["pass"] = data.pop("pass_")
        if data["skipped"] is None:
            del data["skipped"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        """Inverse of ``to_json``."""
        fields = {k: v for k, v in data.items() if k != "pass"}
        return cls(pass_=data["pass"], **fields)


def _group_key(r: Record) -> tuple[str, str, str]:
    return r.bench, r.pass_, json.dumps(r.shape, sort_keys=True)


def fill_ratios(records: Sequence[Record], baseline_name: str) -> list[Record]:
    """Set ``baseline`` and ``ratio`` (ms_median / baseline's ms_median) on every record, the
    baseline being the record named ``baseline_name`` with the same bench, pass and shape.
    Skipped records keep ratio None. Raises ``ValueError`` when a group has no baseline record,
    or a measured record's baseline was skipped. Returns the same records."""
    base = {_group_key(r): r for r in records if r.name == baseline_name}
    for r in records:
        ref = base.get(_group_key(r))
        if ref is None:
            raise ValueError(
                f"no {baseline_name!r} record for bench={r.bench!r} pass={r.pass_!r} "
                f"shape={r.shape}"
            )
        r.baseline = baseline_name
        if r.skipped is not None:
            r.ratio = None
            continue
        if ref.skipped is not None:
            raise ValueError(
                f"the {baseline_name!r} record for bench={r.bench!r} pass={r.pass_!r} "
                f"shape={r.shape} was skipped ({ref.skipped}), so {r.name!r} has no ratio"
            )
        r.ratio = r.ms_median / ref.ms_median
    return list(records)


def write_json(
    path: str | os.PathLike[str],
    records: Sequence[Record],
    summary: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``{"machine": machine_info(), "results": [...]}`` atomically, plus ``"summary":
    summary`` when given. Every record that was not skipped needs its ratio filled."""
    missing = [r.name for r in records if r.ratio is None and r.skipped is None]
    if missing:
        raise ValueError(f"records without a ratio (call fill_ratios first): {missing}")
    path = Path(path)
    payload: dict[str, Any] = {"machine": machine_info(),
                               "results": [r.to_json() for r in records]}
    if summary is not None:
        payload["summary"] = dict(summary)
    atomic_write_json(path, payload)
    return path


BENCH_FILE = "a bench JSON file ({machine, results}, written by attnlab bench)"


def read_json(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Record]]:
    """The machine dict and the records of a file written by ``write_json``; ``ValueError``
    naming the file (and the result) for anything else."""
    payload = readers.read_json(path, BENCH_FILE)
    machine, results = payload.get("machine"), payload.get("results")
    if not isinstance(machine, dict) or not isinstance(results, list):
        raise ValueError(f"{path}: no machine and results; expected {BENCH_FILE}")
    records = []
    for i, result in enumerate(results):
        try:
            records.append(Record.from_json(result))
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: result {i} is not a bench record ({type(err).__name__}: "
                             f"{err}); expected {BENCH_FILE}") from err
    return machine, records


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``"summary"`` mapping of a file written by ``write_json`` ({} when it has none)."""
    return dict(readers.read_json(path, BENCH_FILE).get("summary", {}))


def format_table(records: Sequence[Record]) -> str:
    """A Markdown table: bench, pass, shape, name, median/min ms, peak MiB, ratio."""
    head = "| bench | pass | shape | name | ms median | ms min | peak MiB | ratio |"
    lines = [head, "|" + "---|" * 8]
    for r in records:
        shape = ", ".join(f"{k}={v}" for k, v in r.shape.items())
        if r.skipped is not None:
            lines.append(f"| {r.bench} | {r.pass_} | {shape} | {r.name} | - | - | - | "
                         f"skipped: {r.skipped} |")
            continue
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x {r.baseline}"
        lines.append(
            f"| {r.bench} | {r.pass_} | {shape} | {r.name} | {r.ms_median:.3f} | "
            f"{r.ms_min:.3f} | {r.peak_mem_mb:.1f} | {ratio} |"
        )
    return "\n".join(lines)
