"""Reports over finished runs and benchmarks: Markdown tables, PNG plots and a JSON record.

:mod:`attnlab.report.curves` reads runs and draws their quality curves;
:mod:`attnlab.report.inputs` finds the inputs of a report, :mod:`attnlab.report.figures`
derives its figures, :mod:`attnlab.report.plots` and :mod:`attnlab.report.tables` draw and
write them, and :mod:`attnlab.report.build` assembles the full report of ``attnlab report`` /
``attnlab demo``.
"""

from attnlab.report.build import build_report
from attnlab.report.curves import (
    RunCurves,
    curves_table,
    plot_curves,
    plot_quality,
    read_run,
)
from attnlab.report.inputs import ReportInputs, collect
from attnlab.report.tables import compact_table

__all__ = ["ReportInputs", "RunCurves", "build_report", "collect", "compact_table",
           "curves_table", "plot_curves", "plot_quality", "read_run"]
