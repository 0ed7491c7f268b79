"""Benchmark results, the low floor shared by whoever writes them (``attnlab.bench``) and
whoever reads them (the report, the demo, distillation, the figures of ``visualize``).

* :mod:`~attnlab.results.records`: the ``Record`` JSON schema, ratios, the machine's facts,
  Markdown tables;
* :mod:`~attnlab.results.timing`: side-by-side timing and peak memory of candidates;
* :mod:`~attnlab.results.figures`: matplotlib figures (optional extra ``attnlab[plot]``);
* :mod:`~attnlab.results.scaling` and :mod:`~attnlab.results.serve`: the summaries, tables
  and plots of the scaling and serving benchmarks' records.
"""

from attnlab.results.records import (
    BENCH_FILE,
    PASSES,
    Record,
    fill_ratios,
    format_table,
    machine_info,
    read_json,
    read_summary,
    write_json,
)
from attnlab.results.timing import (
    MIN_REPS,
    Timing,
    fwd,
    fwdbwd,
    peak_memory_mb,
    time_call,
    time_side_by_side,
)

__all__ = [
    "BENCH_FILE", "MIN_REPS", "PASSES", "Record", "Timing", "fill_ratios", "format_table",
    "fwd", "fwdbwd", "machine_info", "peak_memory_mb", "read_json", "read_summary",
    "time_call", "time_side_by_side", "write_json",
]
