"""`raymtl.tune` and `raymtl tune`: a hyperparameter sweep of one experiment on Ray Tune.

    raymtl tune jobs/fedavg_digits.yaml \\
        --param "algorithm.params.lr=loguniform(1e-3, 1e-1)" \\
        --param "algorithm.params.momentum=choice(0.0, 0.5, 0.9)" \\
        --samples 16 --metric mean_accuracy --mode max --scheduler asha

Each `--param` is `a.b.c=kind(values)`, one of Tune's search spaces: uniform(low, high),
loguniform(low, high), randint(low, high) (low <= x < high), choice(a, b, ...) and
grid(a, b, ...) (every value, crossed with the other grids). `--search grid` turns every
choice into a grid as well. A trial is the experiment with the sampled values set, on its
first seed, as a Tune trial in a placement group of its client actors (runtime/trials/runs.py);
it reports `metric` after every evaluated round through a round callback, so ASHA
(time unit: the round) stops the trials that fall behind early. The sweep folder holds each
trial's run directory (trials/<trial id>), Tune's own logs (tune/), the trials' table
(trials.csv) and the best configuration as a runnable experiment file (best.yaml: the
experiment with the best values and all its seeds).
"""

from __future__ import annotations

import ast
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from raymtl.api.experiments import Experiment, raw_experiment
from raymtl.config import ConfigError, ExperimentConfig, parse_config, with_values
from raymtl.paths import make_directory

# kind -> (its arguments, as the one-line error names them)
PARAM_KINDS = {
    "uniform": "uniform(low, high)",
    "loguniform": "loguniform(low, high)",
    "randint": "randint(low, high)",
    "choice": "choice(a, b, ...)",
    "grid": "grid(a, b, ...)",
}
ALLOWED = ", ".join(PARAM_KINDS.values())
PARAM_PATTERN = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=\s*([a-z]+)\s*\((.*)\)\s*$", re.DOTALL)
SEARCHES = ("random", "grid")
SCHEDULERS = ("fifo", "asha")
MODES = ("max", "min")
RANDOM_SAMPLES = 8  # --samples when not given for a random search (a grid runs once)


@dataclass(frozen=True)
class ParamSpec:
    """One `--param`: the dotted setting, the kind of search space and its values."""

    key: str
    kind: str
    values: tuple

    def domain(self, search: str):
        """The Tune search space (`--search grid`: a choice is a grid too)."""
        from raymtl.runtime.trials.runs import search_space

        if self.kind == "grid" or (self.kind == "choice" and search == "grid"):
            return search_space("grid", self.values)
        if search == "grid":
            raise ConfigError(
                f"--search grid: '{self.key}' is {self.kind}(...); a grid takes choice(...) "
                "or grid(...) values"
            )
        return search_space(self.kind, self.values)

    def example(self):
        """One value of the space (to validate the setting before any trial runs)."""
        if self.kind in ("choice", "grid"):
            return self.values[0]
        return self.values[0]  # low: inside every numeric space

    def size(self, search: str) -> int:
        """How many trials the space multiplies the samples by (a grid's values)."""
        grid = self.kind == "grid" or (self.kind == "choice" and search == "grid")
        return len(self.values) if grid else 1


def bad_param(text: str, why: str) -> ConfigError:
    return ConfigError(f"--param: '{text}' {why}; allowed: key.path=one of {ALLOWED}")


def parse_values(arguments: str) -> tuple:
    """`1e-3, 0.1` -> (0.001, 0.1); words not quoted (choice(fedavg, local)) are strings."""
    try:
        values = ast.literal_eval(f"({arguments},)")
    except (ValueError, SyntaxError):
        try:
            values = yaml.safe_load(f"[{arguments}]")
        except yaml.YAMLError:
            return ()
    return tuple(values) if isinstance(values, tuple | list) else ()


def parse_param(text: str) -> ParamSpec:
    """`algorithm.params.lr=loguniform(1e-3, 1e-1)` -> its ParamSpec; anything else is one
    ConfigError line naming --param and what is allowed."""
    match = PARAM_PATTERN.match(text)
    if match is None:
        raise bad_param(text, "is not key.path=kind(values)")
    key, kind, arguments = match.groups()
    if kind not in PARAM_KINDS:
        raise bad_param(text, f"has an unknown kind '{kind}'")
    values = parse_values(arguments)
    if not values:
        raise bad_param(text, f"needs values: {PARAM_KINDS[kind]}")
    if kind in ("choice", "grid"):
        return ParamSpec(key, kind, values)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if len(values) != 2 or not numbers:
        raise bad_param(text, f"takes two numbers: {PARAM_KINDS[kind]}")
    low, high = values
    if not low < high:
        raise bad_param(text, f"needs low < high, got {low} and {high}")
    if kind == "loguniform" and low <= 0:
        raise bad_param(text, "needs low > 0 (a log scale)")
    if kind == "randint" and not all(isinstance(v, int) for v in values):
        raise bad_param(text, "takes two whole numbers: randint(low, high), low <= x < high")
    if kind != "randint":
        values = (float(low), float(high))
    return ParamSpec(key, kind, values)


@dataclass(frozen=True)
class Sweep:
    """A finished sweep: its folder, the trials' table, the best values and their file."""

    out_dir: Path
    table: pd.DataFrame  # trials.csv: one row per trial, best first
    metric: str
    mode: str
    best_params: dict  # dotted setting -> the best trial's value
    best_file: Path  # best.yaml: the experiment with them (all its seeds), runnable
    result_grid: Any  # Tune's ResultGrid: every trial's results, logs and errors


def tune(
    experiment: Experiment,
    params: Iterable[str | ParamSpec],
    overrides: Iterable[str] = (),
    samples: int | None = None,
    metric: str = "mean_accuracy",
    mode: str = "max",
    scheduler: str = "fifo",
    search: str = "random",
    out: str | Path | None = None,
    parallel: int | str = "auto",
    max_failures: int = 0,
    callbacks: Iterable = (),
    run_config: Mapping[str, Any] | None = None,
) -> Sweep:
    """Sweep `params` (`key=kind(values)` strings or ParamSpecs) of one experiment through
    Ray Tune and write the best configuration as a runnable experiment file.

    `samples`: trials drawn (random search, default 8) or repeats of the grid (default
    1); `scheduler`: 'fifo' runs every trial to the end, 'asha' stops those that fall
    behind on `metric` (a stopped trial is no error); `parallel`: trials at once, 'auto'
    as many as the cluster holds; `callbacks` are Tune's (ray.tune.Callback, loggers) and
    `run_config` more ray.tune.RunConfig settings."""
    from raymtl.runtime.executors.launch import start_ray
    from raymtl.runtime.trials.plans import ClusterRoom, parse_parallel, plan_trials
    from raymtl.runtime.trials.runs import run_sweep

    specs = [p if isinstance(p, ParamSpec) else parse_param(p) for p in params]
    if not specs:
        raise ConfigError(f"--param: give at least one setting to sweep ({ALLOWED})")
    check_choice("--search", search, SEARCHES)
    check_choice("--scheduler", scheduler, SCHEDULERS)
    check_choice("--mode", mode, MODES)
    if samples is not None and samples < 1:
        raise ConfigError(f"--samples: give 1 or more, not {samples}")
    parallel = parse_parallel(parallel)
    base = raw_experiment(experiment, list(overrides))
    if isinstance(experiment, str | Path):
        base.setdefault("name", Path(experiment).stem)
    cfg = parse_config(base)
    check_metric(metric, cfg)
    spaces = {spec.key: spec.domain(search) for spec in specs}
    try:  # a setting that does not exist or a value it refuses: before any trial runs
        parse_config(with_values(base, {spec.key: spec.example() for spec in specs}))
    except ConfigError as error:
        raise ConfigError(f"--param: {str(error).splitlines()[0]}") from None
    samples = samples or (RANDOM_SAMPLES if search == "random" else 1)
    trials = samples * math.prod(spec.size(search) for spec in specs)
    out = sweep_dir(cfg, out)
    start_ray(cfg, join_up=False)  # trials' placement groups need the CPUs
    trial_cfg = parse_config({**base, "seeds": cfg.seeds[:1]})
    in_flight, plans = plan_trials([trial_cfg], trials, parallel, ClusterRoom.now())
    sweep = {
        "base": base,
        "seeds": trial_cfg.seeds,
        "metric": metric,
        "out": str(out),
        "cwd": os.getcwd(),
    }
    results = run_sweep(
        sweep,
        spaces,
        plans[trial_cfg.name],
        in_flight,
        samples=samples,
        scheduler=scheduler,
        rounds=cfg.rounds,
        mode=mode,
        max_failures=max_failures,
        callbacks=list(callbacks),
        run_config=dict(run_config or {}),
    )
    table = trials_table(results, specs, metric, mode, cfg.rounds)
    table.to_csv(out / "trials.csv", index=False)
    best_params = best_values(results, table, specs, metric)
    best_file = write_best(base, best_params, out / "best.yaml", metric, mode, table, cfg)
    return Sweep(out, table, metric, mode, best_params, best_file, results)


def check_choice(option: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{option}: '{value}' is not one of {', '.join(allowed)}")


def check_metric(metric: str, cfg: ExperimentConfig) -> None:
    """The metric must be a figure of rounds.parquet (what the round callbacks see)."""
    from raymtl.metrics.recorder import ROUNDS_SCHEMA

    if metric not in ROUNDS_SCHEMA.names or metric in ("seed", "round"):
        figures = ", ".join(n for n in ROUNDS_SCHEMA.names if n not in ("seed", "round"))
        raise ConfigError(f"--metric: '{metric}' is not a figure of the rounds ({figures})")


def sweep_dir(cfg: ExperimentConfig, out: str | Path | None) -> Path:
    """A new, empty local folder for the sweep (made here)."""
    if out is None and "://" in cfg.output.dir:
        raise ConfigError("--out: give a local sweep folder when output.dir is a URI")
    if out is None:
        out = Path(cfg.output.dir) / f"tune-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out: '{out}' exists and is not empty; tune writes a new directory")
    return make_directory(out, exist_ok=True)


def trials_table(results, specs: list[ParamSpec], metric: str, mode: str, rounds: int):
    """One row per trial: its values, the rounds it ran, its last metric and how it ended
    ('done', 'stopped early' by the scheduler, or 'error'), best first: the trials that ran
    the most rounds (a figure of an early round is no match for a later one), then by the
    metric."""
    rows = []
    for result in results:
        metrics = result.metrics or {}
        ran = int(metrics.get("round", 0) or 0)
        if result.error is not None:
            status = "error"
        else:
            status = "done" if ran >= rounds else "stopped early"
        row = {"trial": trial_id(result)}
        row.update({spec.key: result.config["params"].get(spec.key) for spec in specs})
        row.update({"rounds": ran, metric: metrics.get(metric, math.nan), "status": status})
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table.sort_values(
            ["rounds", metric], ascending=[False, mode == "min"], na_position="last"
        )
    return table.reset_index(drop=True)


def trial_id(result) -> str:
    return (result.metrics or {}).get("trial_id") or Path(result.path).name


def best_values(results, table: pd.DataFrame, specs, metric: str) -> dict:
    """The values of the best trial: the first row of the table."""
    from raymtl.runtime.faults import RunStopped
    from raymtl.runtime.trials.runs import raise_trial_failure

    reported = table[metric].notna().any() if not table.empty else False
    if not reported:
        errors = [result.error for result in results if result.error is not None]
        if errors:
            raise_trial_failure("tune: every trial", errors[0])
        raise RunStopped(f"tune: no trial reported '{metric}' (is it evaluated every round?)")
    (best,) = [result for result in results if trial_id(result) == table.iloc[0]["trial"]]
    return {spec.key: best.config["params"][spec.key] for spec in specs}


def write_best(
    base: dict, values: dict, path: Path, metric: str, mode: str, table, cfg: ExperimentConfig
) -> Path:
    """The experiment with the best values as a YAML file `raymtl run` takes."""
    raw = with_values(base, values)
    raw["name"] = f"{raw.get('name', 'experiment')}-tuned"
    best = table.iloc[0]
    header = [
        f"# Best of {len(table)} trials of `raymtl tune` ({mode} {metric}: {best[metric]:.6g}",
        f"# after {int(best['rounds'])} rounds on seed {cfg.seeds[0]}).",
        f"# Run: raymtl run {path.name}",
        *[f"#   {key} = {value!r}" for key, value in values.items()],
    ]
    path.write_text("\n".join(header) + "\n" + yaml.safe_dump(raw, sort_keys=False))
    return path


def print_sweep(sweep: Sweep, console) -> None:
    """The trials' table (best first) and where the best configuration is."""
    from rich.table import Table

    table = Table(title=f"tune: {len(sweep.table)} trials ({sweep.mode} {sweep.metric})")
    for column in sweep.table.columns:
        table.add_column(str(column), justify="left" if column in ("trial", "status") else "right")
    for _, row in sweep.table.iterrows():
        table.add_row(*(shown(value) for value in row))
    console.print(table)
    values = ", ".join(f"{key}={value!r}" for key, value in sweep.best_params.items())
    console.print(f"best: {values}")
    console.print(f"best configuration in [bold]{sweep.best_file}[/] (raymtl run it)")
    console.print(f"sweep in [bold]{sweep.out_dir}[/]")


def shown(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value)
