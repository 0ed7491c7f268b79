"""The benchmark records: one JSON schema for every ``attnlab bench`` command, written by
``attnlab.bench`` and read by the report, the demo, distillation and plots::

    {"machine": {"cpu": str, "cores": int, "threads": int, "gpu": str | null, "torch": str},
     "results": [{"bench", "name", "pass": "fwd" | "fwdbwd", "shape": {...}, "ms_median",
                  "ms_min", "peak_mem_mb", "baseline", "ratio"}, ...]}

``ratio`` is ``ms_median`` over the baseline record's ``ms_median`` (same bench, pass and
shape), both measured in the same run by :func:`attnlab.results.timing.time_side_by_side`,
which alternates the candidates rep by rep so that drift (thermal, other load) hits all of
them alike.

Optional additions: a result that was not run (e.g. it would not fit in memory) carries
``"skipped": reason`` and ``null`` times, memory and ratio; a file may carry a top-level
``"summary"`` mapping (bench-specific derived values, e.g. scaling slopes).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.utils import readers
from attnlab.utils.allocator import cpu_allocator_tuned
from attnlab.utils.io import atomic_write_json
from attnlab.utils.provenance import available_cores

PASSES = ("fwd", "fwdbwd")


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
