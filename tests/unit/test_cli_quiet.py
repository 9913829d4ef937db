"""A CLI that answers at once and a quiet terminal (issue 34); the runs behind it are in
tests/integration/test_quiet_runs.py.

- `import raymtl.cli` (all `raymtl --help` needs) loads neither torch, pandas nor Ray; `raymtl
  list` prints the rows an earlier listing kept, without filling the registries (torch);
- Ray's notices about the token of a local Ray are dropped, its other records pass;
- result tables fit 80 and 120 columns without a word cut: columns wrap between words or are
  left out by priority, and the caption names those left out.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from raymtl.api import catalogue_cache
from raymtl.api.comparison import Comparison, print_comparison
from raymtl.cli import app
from raymtl.metrics.report import RESULTS_DROP_ORDER, fit_table, print_summary, results_table
from raymtl.runtime.warm.service import TOKEN_LOGGER, quiet_local_ray

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "pandas", "ray", "numpy", "pyarrow")


def test_the_cli_module_imports_nothing_heavy():
    """What `raymtl --help` pays: a fresh interpreter's `import raymtl.cli`."""
    code = f"import sys, raymtl.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    help_text = CliRunner().invoke(app, ["--help"])
    assert help_text.exit_code == 0
    for command in ("run", "compare", "tune", "report", "up", "down", "list"):
        assert re.search(rf"│ {command} ", help_text.output), command


@pytest.fixture
def catalogue_home(tmp_path, monkeypatch):
    """A home of its own, where this process (whose registries are filled: other tests) may
    keep the catalogue as a fresh `raymtl list` process would."""
    monkeypatch.setenv("RAYMTL_HOME", str(tmp_path))
    monkeypatch.setattr(catalogue_cache, "REGISTRY_MODULES", ())
    return tmp_path / "cache" / "catalogue"


def test_list_keeps_its_rows_and_prints_them_again_without_the_registries(
    catalogue_home, monkeypatch
):
    first = CliRunner().invoke(app, ["list"])
    assert first.exit_code == 0, first.output
    (kept,) = catalogue_home.glob("*.json")
    titles = [title for title, rows in json.loads(kept.read_text())]
    assert titles[0] == "algorithms (algorithm.name)" and len(titles) == 7

    def no_registries():
        raise AssertionError("the rows were built again")

    monkeypatch.setattr("raymtl.api.catalogue.catalogue_rows", no_registries)
    again = CliRunner().invoke(app, ["list"])
    assert again.exit_code == 0 and again.output == first.output
    for name in ("fedavg", "digits", "dirichlet", "cnn_mnist", "erdos_renyi"):
        assert name in again.output, name

    # A fresh interpreter reads them back with no torch imported (what `raymtl list` does).
    code = (
        "import sys, raymtl.cli\n"
        "from raymtl.api.catalogue_cache import cache_file, cached_sections\n"
        "sections = cached_sections(cache_file())\n"
        "print(sections is not None and len(sections), 'torch' in sys.modules)"
    )
    env = {"PATH": "/usr/bin:/bin", "RAYMTL_HOME": str(catalogue_home.parents[1])}
    probe = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["7", "False"]


def test_other_code_is_a_new_key_and_the_old_rows_go(catalogue_home, monkeypatch):
    rows = [("algorithms (algorithm.name)", [("fedavg", "FedAvg", "lr: float=0.1")])]
    monkeypatch.setattr("raymtl.api.catalogue.catalogue_rows", lambda: rows)
    assert CliRunner().invoke(app, ["list"]).exit_code == 0
    (old,) = catalogue_home.glob("*.json")
    monkeypatch.setattr(catalogue_cache, "code_fingerprint", lambda: "edited since")
    assert CliRunner().invoke(app, ["list"]).exit_code == 0
    (new,) = catalogue_home.glob("*.json")
    assert new != old


def test_a_process_whose_registries_are_filled_keeps_nothing(tmp_path, monkeypatch):
    """Here (as in a notebook, or a command forked from `raymtl up`) the registries may hold
    entries of other code: the rows are built from them, and never kept."""
    monkeypatch.setenv("RAYMTL_HOME", str(tmp_path))
    assert catalogue_cache.cache_file() is None
    assert CliRunner().invoke(app, ["list"]).exit_code == 0
    assert not (tmp_path / "cache").exists()


# -- a quiet local Ray ---------------------------------------------------------------------

RAY_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(INFO|WARNING)\b")


def test_ray_token_notices_are_dropped_and_its_other_records_pass():
    from ray._private.authentication import authentication_token_setup as token_setup

    settings = quiet_local_ray(2, dashboard=False)
    assert settings["logging_level"] == logging.WARNING and not settings["log_to_driver"]
    assert quiet_local_ray(2, dashboard=True)["logging_level"] == logging.INFO  # its address
    logger = logging.getLogger(TOKEN_LOGGER)
    assert logger is token_setup.logger
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    # Only the filter may drop a record here: not the level, nor a logging set-up of another
    # test that disabled the loggers it found
    disabled, level = logger.disabled, logger.level
    logger.disabled = False
    logger.setLevel(logging.DEBUG)
    try:
        token_setup._warn_token_auth_enabled()  # Ray's own words, as it starts a local Ray
        logger.info("Generated new authentication token and saved to /home/u/.ray/auth_token")
        token_setup._warn_token_auth_disabled()  # a security warning: the user may act on it
    finally:
        logger.removeHandler(handler)
        logger.disabled, logger.level = disabled, level
    assert [record.getMessage().split(".")[0] for record in seen] == [
        "Token authentication is disabled for this Ray cluster"
    ]


# -- tables that fit -------------------------------------------------------------------------


def stat(mean: float, std: float = 0.0) -> dict:
    return {"mean": mean, "std": std}


def summary(name: str) -> dict:
    """A summary with every column the results table has: memory, a target, faults, tasks."""
    final = {
        "mean_accuracy": stat(0.812, 0.01),
        "worst10_accuracy": stat(0.5, 0.02),
        "worst20_accuracy": stat(0.6, 0.01),
        "std_accuracy": stat(0.1, 0.01),
        "total_bits": stat(2.3e9),
        "wall_time": stat(75.0),
        "total_flops": stat(3.2e12),
    }
    target = {
        "metric": "mean_accuracy",
        "target": 0.8,
        "seeds": 2,
        "seeds_reached": 1,
        "reached": 0.5,
        "rounds": stat(12.0),
        "bits": stat(1.1e9),
        "flops": stat(1.5e12),
    }
    tasks = {
        task: {"clients": 10, "metric": "accuracy", "final": {"loss": stat(0.41), **metrics}}
        for task, metrics in (
            ("digit class", {"accuracy": stat(0.8), "f1": stat(0.79)}),
            ("rotation regression", {"mse": stat(0.12), "mae": stat(0.3)}),
        )
    }
    return {
        "algorithm": name,
        "seeds": [0, 1],
        "final": final,
        "peak_memory": {"total_bytes": stat(2.5e9)},
        "target": target,
        "faults": {"recoveries": 1, "rounds_replayed": 2},
        "tasks": tasks,
    }


def printed(width: int, draw) -> list[str]:
    console = Console(record=True, width=width)
    draw(console)
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_a_comparison_fits_the_terminal_and_cuts_no_word(width, tmp_path):
    summaries = [summary("demo-digits-sfmtl_graph"), summary("demo-digits-fedavg")]
    comparison = Comparison(tmp_path, pd.DataFrame(), {}, summaries)
    lines = printed(width, lambda console: print_comparison(comparison, console))
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= width
    assert "…" not in text
    assert "demo-digits-sfmtl_graph" in text and "81.2±1.0" in text and "2.3 Gb" in text
    assert "1 (2 replayed)" in text  # faults are never left out
    notes = [i for i, line in enumerate(lines) if f"not shown at {width} columns:" in line]
    note = notes[0]  # the results table's (the task table may leave out columns too)
    left_out = " ".join(line.strip() for line in lines[note : note + 3])
    shown = " ".join(lines[: note - 1])
    for header in RESULTS_DROP_ORDER:  # each one either shown or named as left out
        assert header in left_out or all(word in shown for word in header.split()), header
    if width == 120:  # the "TFLO…": whole now
        assert "TFLOPs" in shown and "Worst20 %" in left_out


def test_a_run_table_that_fits_is_printed_as_it_is():
    plain = summary("fedavg")
    for key in ("target", "faults", "tasks", "peak_memory"):
        plain.pop(key)
    table = results_table([plain], "Results")
    assert fit_table(table, Console(width=120)) is table
    lines = printed(120, lambda console: print_summary(plain, "Results", console))
    assert lines[0].strip() == "Results" and len(lines) == 6  # title, 3 rules, header, row
    assert "Worst20 %" in lines[2] and "TFLOPs" in lines[2] and "not shown" not in lines[-1]


def test_a_run_table_at_80_columns_wraps_headers_between_words():
    lines = printed(80, lambda console: print_summary(summary("fedavg"), "Results", console))
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80 and "…" not in text
    assert "Per task" in text and "rotation regression" in text  # the task table fits too
    assert "2.3 Gb" in text and "81.2±1.0" in text  # values never wrap
