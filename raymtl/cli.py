"""`raymtl run | compare | tune | report | up | down | list`.

`run`, `compare` and `tune` are `raymtl.run` / `raymtl.resume` / `raymtl.compare` /
`raymtl.tune` with a progress bar (a `Callback`) and printed tables: one code path for Python
and the command line. Every user error (bad experiment file, impossible combination, missing
dataset, a plugin's constructor or Params raising) is one line on stderr and exit code 2, a
run that cannot go on (recoveries used up, actors the cluster cannot place) one line and exit
code 3, an algorithm's step that raised one line naming it and exit code 1 (the traceback in
the run's run.log) — never a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import raymtl
from raymtl.api.callbacks import Callback, RoundEvent
from raymtl.errors import ConfigError, StepFailed
from raymtl.runtime.faults import RunStopped

# Only what every command needs is imported here: `raymtl --help` answers without torch,
# pandas or Ray, and each command imports the rest itself (benchmarks/RESULTS.md, "The
# command line"). A command forked from `raymtl up` finds them imported (preload.py).

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])


def make_consoles() -> None:
    """The output and error consoles, for the standard streams as they are now (a command
    forked from the preloaded process makes them again on its own terminal: preload.py)."""
    global console, errors
    # Tables stay readable when the output is a file or a pipe (rich falls back to 80 columns).
    console = Console(width=None if sys.stdout.isatty() else 120)
    errors = Console(stderr=True)


console: Console
errors: Console
make_consoles()


# Exit codes (the README's "Exit codes"): 0 done; 1 an unexpected error (a bug), and
BAD_INPUT = 2  # the experiment, an override, the data or a run directory: fix it, run again
RUN_STOPPED = 3  # recoveries used up, or actors the cluster cannot place: fix it, --resume
INTERRUPTED = 130  # Ctrl-C: --resume goes on from the last complete checkpoint
STEP_FAILED = 1  # an algorithm's step raised (a plugin's code): run.log, FAILED; fix, --resume


def fail(message: str, code: int = BAD_INPUT) -> None:
    """Print one error line and exit with `code` (2: bad input)."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


class RoundProgress(Callback):
    """A rich progress bar per experiment and seed; shows the last evaluated accuracy. It
    knows where the run is and how far it got, for the line a Ctrl-C prints."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.label = ""
        self.tasks: dict[tuple[str, int], int] = {}
        self.run_dir: str | None = None
        self.last_round: tuple[int, int] | None = None  # (seed, round) last completed

    def on_run_start(self, config, run_dir: Path) -> None:
        from raymtl.runtime.storage.run_dirs import resumable_location

        self.label = config.name
        self.run_dir = resumable_location(config.output.dir, Path(run_dir))

    def on_round_end(self, event: RoundEvent) -> None:
        self.last_round = (event.seed, event.round)
        key = (self.label, event.seed)
        if key not in self.tasks:
            self.progress.start()  # at the first round: nothing drawn before (progress_bar)
            self.tasks[key] = self.progress.add_task(
                f"{self.label} seed {event.seed}", total=event.rounds, accuracy=""
            )
        accuracy = event.row.get("mean_accuracy")
        shown = "" if accuracy is None or accuracy != accuracy else f"acc {accuracy:.3f}"
        self.progress.update(self.tasks[key], completed=event.round, accuracy=shown)


@contextlib.contextmanager
def progress_bar() -> Iterator[Progress]:
    """The progress bars of a command, shown from its first round on (`RoundProgress`): a
    command that stops before any round (a bad experiment) draws nothing, so its error line
    is the only thing it prints (a bar started at once would leave an empty line)."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[accuracy]}"),
        TimeElapsedColumn(),
        console=console,
    )
    try:
        yield progress
    finally:
        if progress.live.is_started:  # (stop prints a line off a terminal, even unstarted)
            progress.stop()


def trackers(mlflow: bool, mlflow_uri: str | None) -> list[Callback]:
    """The tracker callbacks the options ask for."""
    if not (mlflow or mlflow_uri):
        return []
    from raymtl.api.mlflow import MLflowCallback

    return [MLflowCallback(tracking_uri=mlflow_uri)]


@app.command()
def run(
    file: Annotated[str | None, typer.Argument(help="experiment YAML")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="a.b=value overrides")] = None,
    resume: Annotated[
        str | None, typer.Option(help="continue this run directory (a path or a URI)")
    ] = None,
    mlflow: Annotated[
        bool, typer.Option("--mlflow", help="log to MLflow (file:<output.dir>/mlruns)")
    ] = False,
    mlflow_uri: Annotated[
        str | None, typer.Option(help="log to MLflow at this tracking URI (implies --mlflow)")
    ] = None,
) -> None:
    """Run one experiment file and print its results table."""
    with UserErrors():
        callbacks = trackers(mlflow, mlflow_uri)
        if resume is not None:
            if file is not None and "=" not in file:
                fail(f"run: give an experiment file or --resume RUN_DIR, not both ('{file}')")
            overrides = [file, *(overrides or [])] if file else overrides  # all overrides
        elif file is None:
            fail("run: give an experiment file (or --resume RUN_DIR)")
        with progress_bar() as progress, InterruptedRun(RoundProgress(progress)) as shown:
            callbacks = [shown, *callbacks]
            if resume is not None:
                results = raymtl.resume(resume, overrides or [], callbacks=callbacks)
            else:
                results = raymtl.run(file, overrides or [], callbacks=callbacks)
        print_results(results)
        # A resumed run's startup table begins with its first command's start: said then.
        settings = results.config.model_dump(mode="json")
        hint = None if resume else start_up_hint(settings, results.tables.get("startup"))
        if hint:
            console.print(hint, style="dim", highlight=False, soft_wrap=True)


class InterruptedRun:
    """Ctrl-C during a run: one line saying how far it got and the command that goes on
    from its last complete checkpoint, and exit code 130 (typer would exit silently). A
    step that raised (`StepFailed`): its line gets the same command, to run once the code
    is fixed (`UserErrors` prints it, exit code 1), and a run that stopped (`RunStopped`: exit
    code 3) likewise, once its cause is fixed. `resume_command(run_dir)`: that command,
    for the run (or comparison) in progress."""

    def __init__(self, progress: RoundProgress, resume_command=None):
        self.progress = progress
        self.resume_command = resume_command or (lambda run_dir: f"raymtl run --resume {run_dir}")

    def __enter__(self) -> RoundProgress:
        return self.progress

    def __exit__(self, kind, error, tb):
        if isinstance(error, StepFailed) and self.progress.run_dir is not None:
            command = self.resume_command(self.progress.run_dir)
            line = (
                f"{error.line}; once the code is fixed, `{command}` goes on from the last "
                "complete checkpoint"
            )
            raise StepFailed(line, error.details) from error
        if isinstance(error, RunStopped) and self.progress.run_dir is not None:
            first = (str(error).splitlines() or ["run stopped"])[0]
            command = self.resume_command(self.progress.run_dir)
            line = (
                f"{first}; once the cause is fixed, `{command}` goes on from the last "
                "complete checkpoint"
            )
            raise RunStopped(line) from error
        if not isinstance(error, KeyboardInterrupt):
            return False
        if self.progress.progress.live.is_started:  # the bar's last state stays; the line
            self.progress.progress.stop()  # goes below it
        run_dir, last_round = self.progress.run_dir, self.progress.last_round
        if run_dir is None:
            errors.print("interrupted before the run directory was made: nothing to resume")
            raise typer.Exit(INTERRUPTED)
        if last_round is None:
            done = f"{self.progress.label}: no round done"
        else:
            done = f"{self.progress.label} seed {last_round[0]} round {last_round[1]} done"
        errors.print(
            f"interrupted ({done}): `{self.resume_command(run_dir)}` goes on from the last "
            "complete checkpoint",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(INTERRUPTED)


def print_results(results) -> None:
    """The run's results table, its plots (if it drew any) and where it is."""
    from raymtl.metrics.report import print_summary

    plots = sorted((results.run_dir / "plots").glob("*.png"))
    print_summary(results.summary, f"Results: {results.run_dir}", console, plots)
    console.print(f"results in [bold]{results.location}[/]")


# A first round later than this after a command that started a local Ray of its own: worth
# saying that `raymtl up` takes Ray's and the actors' start off the next commands
# (benchmarks/RESULTS.md, "Between commands").
SLOW_START_S = 10.0


def start_up_hint(config: dict, startup) -> str | None:
    """One line for a run that started a local Ray of its own (no `runtime.address`, not
    joined to `raymtl up`, `runtime.join_up` not off) and whose first round began
    SLOW_START_S or more after the command: where the seconds went (startup.parquet's first
    row), and what keeps them off later commands. None otherwise. `config`: the run's
    settings as config.yaml holds them."""
    runtime = config.get("runtime", {})
    if runtime.get("executor") != "ray" or runtime.get("address") or not runtime.get("join_up"):
        return None
    if startup is None or startup.empty or "joined_up" not in startup:
        return None
    first = startup.iloc[0]
    if bool(first["joined_up"]) or first["process_s"] < SLOW_START_S:
        return None
    return (
        f"start-up: the first round began {first['process_s']:.0f} s after the command (Ray "
        f"{first['ray_s']:.1f} s, actors {first['hosts_up_s']:.1f} s, build and warm-up "
        f"{first['build_s']:.1f} s); `raymtl up` keeps a Ray and warm actors for the next "
        "commands"
    )


@app.command()
def compare(
    items: Annotated[
        list[str] | None, typer.Argument(help="experiment files and a.b=v overrides")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="comparison directory")] = None,
    parallel: Annotated[
        str,
        typer.Option(
            help="run the experiments' seeds as Ray Tune trials, this many at once ('auto': "
            "as many as the cluster holds); 1 = one after another, here"
        ),
    ] = "1",
    max_failures: Annotated[
        int, typer.Option(help="with --parallel: retries of a failed trial, from its checkpoint")
    ] = 2,
    resume: Annotated[
        Path | None,
        typer.Option(help="go on with this interrupted comparison folder (no experiments)"),
    ] = None,
) -> None:
    """Run several experiments (or `algorithm.name=a,b`) on the same data and seeds."""
    from raymtl.api.comparison import print_comparison

    with UserErrors():
        items = items or []
        if not items and resume is None:
            fail("compare: give experiment files (or --resume COMPARISON_DIR)")
        files = [item for item in items if "=" not in item]
        overrides = [item for item in items if "=" in item]
        again = "" if parallel == "1" else f" --parallel {parallel}"

        def resume_command(run_dir: str) -> str:
            return f"raymtl compare --resume {Path(run_dir).parent}{again}"

        with (
            progress_bar() as progress,
            InterruptedRun(RoundProgress(progress), resume_command) as shown,
        ):
            comparison = raymtl.compare(
                files,
                overrides,
                out=out,
                callbacks=[shown],
                parallel=parallel,
                max_failures=max_failures,
                resume=resume,
            )
        print_comparison(comparison, console)


@app.command()
def tune(
    file: Annotated[str, typer.Argument(help="experiment YAML")],
    overrides: Annotated[list[str] | None, typer.Argument(help="a.b=value overrides")] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            help="a setting to sweep, key.path=kind(values): uniform(low, high), "
            "loguniform(low, high), randint(low, high), choice(a, b, ...), grid(a, b, ...); "
            "repeatable"
        ),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(help="trials drawn (random search; default 8) or repeats of the grid"),
    ] = None,
    metric: Annotated[str, typer.Option(help="a figure of the rounds")] = "mean_accuracy",
    mode: Annotated[str, typer.Option(help="max or min")] = "max",
    scheduler: Annotated[
        str, typer.Option(help="fifo, or asha: stop trials that fall behind early")
    ] = "fifo",
    search: Annotated[
        str, typer.Option(help="random, or grid (every choice(...) a grid too)")
    ] = "random",
    out: Annotated[Path | None, typer.Option(help="sweep directory")] = None,
    parallel: Annotated[
        str, typer.Option(help="trials at once ('auto': as many as the cluster holds)")
    ] = "auto",
) -> None:
    """Sweep settings of one experiment with Ray Tune; writes the best as an experiment file."""
    from raymtl.api.tuning import print_sweep

    with UserErrors():
        if not param:
            fail(
                "--param: give at least one setting to sweep, e.g. "
                '--param "algorithm.params.lr=loguniform(1e-3, 1e-1)"'
            )
        sweep = raymtl.tune(
            file,
            param,
            overrides or [],
            samples=samples,
            metric=metric,
            mode=mode,
            scheduler=scheduler,
            search=search,
            out=out,
            parallel=parallel,
        )
        print_sweep(sweep, console)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="a run directory, or a comparison's")],
) -> None:
    """Re-draw the plots and the table of a run (or of a comparison) from its Parquet files."""
    from raymtl.api.comparison import print_comparison, report_comparison
    from raymtl.metrics.report import report as report_run

    with UserErrors():
        if (run_dir / "rounds.parquet").is_file():
            report_run(run_dir, console=console)
            say_if_failed(run_dir)
        elif run_dir.is_dir():
            print_comparison(report_comparison(run_dir), console)
        else:
            fail(f"run_dir: '{run_dir}' is not a folder")


def say_if_failed(run_dir: Path) -> None:
    """One line under a report of a run marked FAILED (an algorithm's step raised)."""
    from raymtl.runtime.storage.run_dirs import failed_line

    line = failed_line(run_dir)
    if line is not None:
        errors.print(
            f"[bold red]this run failed:[/] {escape(line)}; `raymtl run --resume {run_dir}` "
            "goes on from its last complete checkpoint once the code is fixed",
            highlight=False,
            soft_wrap=True,
        )


@app.command()
def up(
    num_cpus: Annotated[
        int | None, typer.Option(min=1, help="CPUs of its Ray (default: this machine's)")
    ] = None,
    client_actors: Annotated[
        int | None, typer.Option(min=1, help="warm client actors (default: fill the CPUs)")
    ] = None,
    cpus_per_actor: Annotated[
        float, typer.Option(min=0.01, help="CPUs a client actor takes (runtime.num_cpus_per_actor)")
    ] = 1.0,
    gpus_per_actor: Annotated[
        float, typer.Option(min=0.0, help="GPUs a client actor takes (runtime.num_gpus_per_actor)")
    ] = 0.0,
    preload: Annotated[
        bool,
        typer.Option(help="keep a process with raymtl imported: commands fork from it"),
    ] = True,
) -> None:
    """Keep a Ray and warm actors on this machine: later runs join them (no start-up)."""
    from raymtl.paths import raymtl_home
    from raymtl.runtime.warm.service import up

    try:
        service, started = up(
            num_cpus, client_actors, cpus_per_actor, gpus_per_actor, preload=preload
        )
    except RuntimeError as error:
        fail(str(error), RUN_STOPPED)
    actors = ", ".join(f"{count} {role}" for role, count in service.actors.items())
    state = "started" if started else "already running"
    console.print(
        f"raymtl up: {state} (pid {service.pid}, Ray at {service.address}, "
        f"{service.num_cpus} CPUs; warm actors: {actors}"
        f"{'; commands forked from a preloaded process' if service.preloaded else ''}); "
        f"state in {raymtl_home()}. Runs with runtime.address: null join it; `raymtl down` "
        "stops it.",
        highlight=False,
    )


@app.command()
def down() -> None:
    """Stop the Ray and warm actors of `raymtl up`."""
    from raymtl.runtime.warm.service import down as stop_service

    service = stop_service()
    if service is None:
        console.print("raymtl down: no service running", highlight=False)
    else:
        console.print(f"raymtl down: stopped (pid {service.pid})", highlight=False)


@app.command(name="list")
def list_components(
    plugin: Annotated[
        list[str] | None,
        typer.Option(help="load this plugin first (a module name or a .py path); repeatable"),
    ] = None,
) -> None:
    """Algorithms, datasets, partitions, models, topologies and targets with their parameters."""
    from raymtl.api.catalogue_cache import cache_file, cached_sections, keep_sections, table

    # Without plugins, the rows an earlier `raymtl list` kept: no torch import (catalogue_cache)
    kept = None if plugin else cache_file()
    sections = cached_sections(kept)
    if sections is None:
        from raymtl.api.catalogue import catalogue_rows
        from raymtl.plugins import load_plugins, resolve_entry

        if plugin:
            with UserErrors():
                load_plugins([resolve_entry(entry) for entry in plugin])
        sections = catalogue_rows()
        keep_sections(kept, sections)
    for title, rows in sections:
        console.print(table(title, rows))


class UserErrors:
    """Turn configuration and data errors (a plugin's constructor or Params raising
    included) into one line + exit 2, a run that cannot go on into one line + exit 3, an
    exception in an algorithm's step into one line naming it + exit 1 (its traceback in the
    run's run.log)."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        from raymtl.data import DatasetMissing

        if isinstance(error, ConfigError | DatasetMissing):
            fail(str(error).splitlines()[0])
        if isinstance(error, RunStopped):
            fail(str(error).splitlines()[0], RUN_STOPPED)
        if isinstance(error, StepFailed):
            fail(error.line, STEP_FAILED)
        return False


def main() -> None:
    logging.basicConfig(level=os.environ.get("RAYMTL_LOG", "WARNING"))
    try:
        app()
    except KeyboardInterrupt:
        errors.print("interrupted: resume with `raymtl run --resume RUN_DIR`")
        sys.exit(INTERRUPTED)


__all__ = ["app", "main"]
