"""The registries of algorithm tables' reporters and plotters (graph.parquet, clusters.parquet...).

An algorithm that records its own table (`ctx.record("graph", ...)` in a step) registers, for
it, a reporter that adds its figures to summary.json and, if it draws any, a plotter that
draws its plots (only when the run's `output.plots` is true, or on `raymtl report`):

    @table_reporter("graph")
    def report_graph(run_dir: Path, summary: dict) -> None:
        summary["communities"] = ...

    @table_plotter("graph")
    def plot_graph(run_dir: Path) -> list[Path]:
        return [save_figure(..., run_dir / "plots" / "communities.png")]

The built-in ones live in `raymtl/metrics/tables/`, which runs those of the tables a run has;
a plugin registers its own the same way. This module imports nothing of raymtl: the
reporters import it, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

Reporter = Callable[[Path, dict], None]
Plotter = Callable[[Path], list[Path]]
TABLE_REPORTERS: dict[str, Reporter] = {}
TABLE_PLOTTERS: dict[str, Plotter] = {}


def table_reporter(table: str) -> Callable[[Reporter], Reporter]:
    """Register `function(run_dir, summary)` as the reporter of `<table>.parquet`.

    Args:
        table: the table's name, as steps record it (`ctx.record(table, ...)`).

    Returns:
        The decorator: it registers the reporter and returns it unchanged.
    """

    def register(function: Reporter) -> Reporter:
        TABLE_REPORTERS[table] = function
        return function

    return register


def table_plotter(table: str) -> Callable[[Plotter], Plotter]:
    """Register `function(run_dir) -> written paths` as the plotter of `<table>.parquet`.

    Args:
        table: the table's name, as steps record it (`ctx.record(table, ...)`).

    Returns:
        The decorator: it registers the plotter and returns it unchanged.
    """

    def register(function: Plotter) -> Plotter:
        TABLE_PLOTTERS[table] = function
        return function

    return register
