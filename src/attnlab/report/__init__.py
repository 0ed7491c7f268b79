"""Reports over finished runs and benchmarks: Markdown tables, PNG plots and a JSON record.

:mod:`attnlab.report.curves` reads runs and draws their quality curves;
:mod:`attnlab.report.build` assembles the full report of ``attnlab report`` / ``attnlab demo``.
"""

from attnlab.report.build import ReportInputs, build_report, collect, compact_table
from attnlab.report.curves import (
    RunCurves,
    curves_table,
    plot_curves,
    plot_quality,
    read_run,
)

__all__ = ["ReportInputs", "RunCurves", "build_report", "collect", "compact_table",
           "curves_table", "plot_curves", "plot_quality", "read_run"]
