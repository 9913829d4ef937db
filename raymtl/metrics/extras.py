"""Reporters for algorithm tables (graph.parquet, clusters.parquet, ...).

An algorithm that records its own table (`ctx.record("graph", ...)` in a step)
registers a reporter for it in a module of `raymtl/metrics/tables/`; `summarize`
calls the reporters of the tables a run has, and they add their figures to
summary.json and draw their plots.

    @table_reporter("graph")
    def report_graph(run_dir: Path, summary: dict) -> None:
        summary["communities"] = ...
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

Reporter = Callable[[Path, dict], None]
TABLE_REPORTERS: dict[str, Reporter] = {}


def table_reporter(table: str) -> Callable[[Reporter], Reporter]:
    """Register `function(run_dir, summary)` as the reporter of `<table>.parquet`."""

    def register(function: Reporter) -> Reporter:
        TABLE_REPORTERS[table] = function
        return function

    return register


def load_reporters() -> None:
    """Import every module of `raymtl.metrics.tables` (each registers its reporter)."""
    import raymtl.metrics.tables as tables

    for module in pkgutil.iter_modules(tables.__path__):
        importlib.import_module(f"{tables.__name__}.{module.name}")


def report_extra_tables(run_dir: Path, summary: dict) -> None:
    """Run the reporter of every algorithm table present in `run_dir` (in place on summary)."""
    load_reporters()
    for table, reporter in TABLE_REPORTERS.items():
        if (Path(run_dir) / f"{table}.parquet").is_file():
            reporter(Path(run_dir), summary)
