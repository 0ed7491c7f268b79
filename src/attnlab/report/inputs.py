"""Input discovery for the report: :func:`collect` reads any mix of

* run folders of ``attnlab train`` (``summary.json`` + ``metrics.jsonl``): the quality
  curves and the headline table;
* run folders of ``attnlab distill`` (also ``distill.yaml``): teacher vs student quality and
  SEA's dynamic-k x query-skip grid;
* bench JSON files (:mod:`attnlab.results`): ``train`` records give the training step
  times measured side by side (the wall-clock axis and every speed ratio of the headline),
  ``attention`` / ``attention-layer`` records the time and memory against sequence length,
  others a plain table; one file per kind, as ratios are only taken within one file;
* ``demo.json`` (written by ``attnlab demo``): the demo's budget and stage times;
* ``attnlab long-context`` JSON files: the long-context frontier (quality kept against the
  speed of a ``serve`` bench file, :mod:`attnlab.report.frontier`);
* a folder holding none of these at its top (e.g. a demo's output): its entries, recursively.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlab.report.curves import RunCurves, read_run
from attnlab.results import Record, read_json
from attnlab.utils.readers import parse_json

SCALING_BENCHES = ("attention-layer", "attention")
STEP_BENCH = "train"
SERVE_BENCH = "serve"  # attnlab bench serve: one file per model (its ratios are per run)
LONG_CONTEXT = "long-context"  # attnlab long-context's JSON: the frontier's quality axis
REPORT_JSON = "results.json"  # what build_report writes; never read back as an input


@dataclasses.dataclass
class ReportInputs:
    """Everything :func:`collect` found. ``runs``: trained models; ``students``: distilled
    runs ``(name, summary)``, ``student_curves`` their held-out curves; ``step_times``:
    ``train`` bench records (one file); ``scaling``: length-scaling records by bench name;
    ``other``: any other bench records; ``machines``: the machine of each bench file, by
    path; ``demo``: the demo's own record."""

    runs: list[RunCurves] = dataclasses.field(default_factory=list)
    students: list[tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
    student_curves: list[RunCurves] = dataclasses.field(default_factory=list)
    step_times: list[Record] = dataclasses.field(default_factory=list)
    scaling: dict[str, list[Record]] = dataclasses.field(default_factory=dict)
    other: list[Record] = dataclasses.field(default_factory=list)
    machines: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    demo: dict[str, Any] | None = None
    long_context: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sources: list[str] = dataclasses.field(default_factory=list)


def collect(paths: Iterable[str | os.PathLike[str]]) -> ReportInputs:
    """Read every input (module docstring). Raises ``FileNotFoundError`` for a missing path
    and ``ValueError`` for a file that is none of the known kinds, for two bench files of the
    same kind (their ratios would mix two runs), or when nothing was found."""
    found = ReportInputs()
    paths = [Path(p) for p in paths]
    for path in paths:
        _collect_one(path, found)
    if not found.sources:
        raise ValueError(f"no run folders or bench JSON files in {', '.join(map(str, paths))}")
    return found


def _collect_one(path: Path, found: ReportInputs, depth: int = 0) -> None:
    """Read ``path`` into ``found``. A folder's entries are read up to two levels down
    (``demo/runs/<run>``), where files of other kinds are passed over; a path given
    explicitly (``depth`` 0) must be of a known kind."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_dir():
        if (path / "summary.json").is_file():
            found.sources.append(str(path))
            if (path / "distill.yaml").is_file():
                curves = read_run(path)
                found.students.append((path.name, curves.summary))
                found.student_curves.append(curves)
            else:
                found.runs.append(read_run(path))
        elif depth < 2:
            for child in sorted(path.iterdir()):
                if child.is_dir() or child.suffix == ".json" and child.name != REPORT_JSON:
                    _collect_one(child, found, depth + 1)
        return
    if path.suffix != ".json":
        raise ValueError(f"{path}: not a bench JSON file, demo.json or run folder")
    payload = parse_json(path, "a bench JSON file, demo.json or long-context JSON")
    demo = payload["demo"] if isinstance(payload, dict) and set(payload) == {"demo"} else None
    if isinstance(demo, dict):
        found.demo = demo
    elif isinstance(payload, dict) and payload.get("bench") == LONG_CONTEXT:
        found.long_context.append(payload)
    elif isinstance(payload, dict) and "machine" in payload and "results" in payload:
        machine, records = read_json(path)
        found.machines[str(path)] = machine
        for kind in dict.fromkeys(r.bench for r in records):
            mine = [r for r in records if r.bench == kind]
            if kind == STEP_BENCH:
                _only_once(found.step_times, kind, path)
                found.step_times = mine
            elif kind in SCALING_BENCHES:
                _only_once(found.scaling.get(kind), kind, path)
                found.scaling[kind] = mine
            elif kind == SERVE_BENCH:
                _only_once([r for r in found.other if r.bench == kind
                            and model_of(r) in {model_of(m) for m in mine}], kind, path)
                found.other.extend(mine)
            else:
                found.other.extend(mine)
    elif depth == 0:
        raise ValueError(f"{path}: not a bench JSON file, demo.json or run folder")
    else:
        return
    found.sources.append(str(path))


def model_of(record: Record) -> tuple[str | None, str | None]:
    """The model a bench record names: its label and fingerprint (None: not recorded)."""
    return record.shape.get("model"), record.shape.get("model_sha256")


def model_name(model: str | None, fingerprint: str | None) -> str:
    """Markdown: a model's label or path and its fingerprint."""
    return f"`{model}` (fingerprint `{fingerprint or 'not recorded'}`)"


def _only_once(existing: list[Record] | None, kind: str, path: Path) -> None:
    if existing:
        per = "model" if kind == SERVE_BENCH else "kind"
        raise ValueError(f"{path}: a second set of {kind!r} bench records; ratios are only "
                         f"taken within one run, so give one file per {per}")
