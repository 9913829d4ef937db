"""The reporters and plotters of the algorithms' own tables, and the two functions that run
those of the tables a run has (`summarize` and `plot_run` call them).

Importing this package registers the built-in ones (in `raymtl.metrics.extras`); a plugin's
are registered when the plugin is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from raymtl.metrics.extras import TABLE_PLOTTERS, TABLE_REPORTERS
from raymtl.metrics.tables import clusters, faults, graph, ifca, leaders, maps, step_metrics

BUILT_IN = (clusters, faults, graph, ifca, leaders, maps, step_metrics)


def present(run_dir: Path, registry: dict[str, Callable]) -> list[Callable]:
    """The registry's functions for the tables the run has."""
    return [
        function
        for table, function in registry.items()
        if (Path(run_dir) / f"{table}.parquet").is_file()
    ]


def report_extra_tables(run_dir: Path, summary: dict) -> None:
    """Run the reporter of every algorithm table present in `run_dir` (in place on summary)."""
    for reporter in present(run_dir, TABLE_REPORTERS):
        reporter(Path(run_dir), summary)


def plot_extra_tables(run_dir: Path) -> list[Path]:
    """Run the plotter of every algorithm table present in `run_dir`; the paths written."""
    return [path for plotter in present(run_dir, TABLE_PLOTTERS) for path in plotter(run_dir)]
