"""`raymtl run | compare | report | list`.

Every user error (bad experiment file, impossible combination, missing dataset)
is one line on stderr and exit code 2 — never a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from raymtl.config import ConfigError, load_config, load_raw, parse_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
# Tables stay readable when the output is a file or a pipe (rich falls back to 80 columns).
console = Console(width=None if sys.stdout.isatty() else 120)
errors = Console(stderr=True)


def fail(message: str) -> None:
    """Print one error line and exit 2."""
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


class RoundProgress:
    """A rich progress bar per seed; shows the last evaluated accuracy."""

    def __init__(self, progress: Progress, label: str, rounds: int):
        self.progress, self.label, self.rounds = progress, label, rounds
        self.tasks: dict[int, int] = {}

    def __call__(self, seed: int, round_index: int, row: dict) -> None:
        if seed not in self.tasks:
            self.tasks[seed] = self.progress.add_task(
                f"{self.label} seed {seed}", total=self.rounds, accuracy=""
            )
        accuracy = row.get("mean_accuracy")
        shown = "" if accuracy is None or accuracy != accuracy else f"acc {accuracy:.3f}"
        self.progress.update(self.tasks[seed], completed=round_index, accuracy=shown)


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[accuracy]}"),
        TimeElapsedColumn(),
        console=console,
    )


def run_one(cfg, run_dir: Path | None = None) -> Path:
    """Run one experiment with a progress bar; returns its run directory."""
    from raymtl.runtime import run_experiment

    with progress_bar() as progress:
        return run_experiment(cfg, run_dir, RoundProgress(progress, cfg.name, cfg.rounds))


@app.command()
def run(
    file: Annotated[str | None, typer.Argument(help="experiment YAML")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="a.b=value overrides")] = None,
    resume: Annotated[
        str | None, typer.Option(help="continue this run directory (a path or a URI)")
    ] = None,
) -> None:
    """Run one experiment file and print its results table."""
    from raymtl.metrics import report

    with user_errors():
        if resume is not None:
            from raymtl.runtime import resume_experiment
            from raymtl.runtime.api import load_run_config

            if file is not None and "=" not in file:
                fail(f"run: give an experiment file or --resume RUN_DIR, not both ('{file}')")
            overrides = [file, *(overrides or [])] if file else overrides  # all overrides
            cfg = load_run_config(resume, overrides or [])
            with progress_bar() as progress:
                run_dir = resume_experiment(
                    resume, RoundProgress(progress, cfg.name, cfg.rounds), overrides or []
                )
        else:
            if file is None:
                fail("run: give an experiment file (or --resume RUN_DIR)")
            run_dir = run_one(load_config(file, overrides or []))
        report(local_copy(run_dir), console=console)
        console.print(f"results in [bold]{run_dir}[/]")


@app.command()
def compare(
    items: Annotated[list[str], typer.Argument(help="experiment files and a.b=v overrides")],
    out: Annotated[Path | None, typer.Option(help="comparison directory")] = None,
) -> None:
    """Run several experiments (or `algorithm.name=a,b`) on the same data and seeds."""
    from raymtl.compare import compare_experiments, expand_experiments

    with user_errors():
        configs = expand_experiments(items)
        compare_experiments(configs, out, run_one, console)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="a run directory")]) -> None:
    """Re-draw the plots and the table of a run from its Parquet files."""
    from raymtl.metrics import report as report_run

    with user_errors():
        if not (run_dir / "rounds.parquet").is_file():
            fail(f"run_dir: '{run_dir}' has no rounds.parquet (not a finished run)")
        report_run(run_dir, console=console)


@app.command(name="list")
def list_components() -> None:
    """Algorithms, datasets, partitions, models and topologies with their parameters."""
    from raymtl.catalogue import catalogue_tables

    for table in catalogue_tables():
        console.print(table)


def local_copy(run_dir) -> Path:
    """A run's local folder: itself, or the staging folder of a run kept at a URI."""
    from raymtl.runtime.storage import Location, is_uri

    if not is_uri(run_dir):
        return Path(run_dir)
    from raymtl.runtime.api import staging_dir

    return staging_dir(Location.of(run_dir))


class user_errors:
    """Turn configuration and data errors into one line + exit 2."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        from raymtl.data import DatasetMissing

        if isinstance(error, ConfigError | DatasetMissing):
            fail(str(error).splitlines()[0])
        return False


def main() -> None:
    logging.basicConfig(level=os.environ.get("RAYMTL_LOG", "WARNING"))
    try:
        app()
    except KeyboardInterrupt:
        errors.print("interrupted: resume with `raymtl run --resume RUN_DIR`")
        sys.exit(130)


__all__ = ["app", "main", "load_raw", "parse_config"]
