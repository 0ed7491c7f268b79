"""Reports over finished runs: quality curves as Markdown tables and PNG plots."""

from attnlab.report.curves import RunCurves, curves_table, plot_curves, read_run

__all__ = ["RunCurves", "curves_table", "plot_curves", "read_run"]
