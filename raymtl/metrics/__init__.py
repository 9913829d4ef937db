"""Metrics: fairness statistics, Parquet recording, plots and run reports."""

from raymtl.metrics.fairness import fairness_stats
from raymtl.metrics.plots import plot_comparison, plot_run
from raymtl.metrics.recorder import Recorder

# Imported last and eagerly: the function ``report`` shares its name with the submodule, and this
# binding must be the final one so ``from raymtl.metrics import report`` gives the function.
from raymtl.metrics.report import report, results_table, summarize

__all__ = [
    "Recorder",
    "fairness_stats",
    "plot_comparison",
    "plot_run",
    "report",
    "results_table",
    "summarize",
]
