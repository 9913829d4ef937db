"""`raymtl.compare` and `raymtl compare`: several experiments on one partition and one set
of seeds.

Each experiment runs into its own run directory inside the comparison directory; the
comparison adds one table (table.csv, summary.json) and, unless every experiment says
`output.plots: false`, side-by-side figures. `a.b=x,y` fans one experiment out into several.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console

from raymtl.api.callbacks import Callback
from raymtl.api.experiments import Experiment, experiment_configs
from raymtl.api.results import Results, results_of
from raymtl.api.running import resume as resume_run
from raymtl.api.running import run
from raymtl.config import ConfigError, ExperimentConfig, parse_config
from raymtl.metrics import plot_comparison, results_table
from raymtl.metrics.delta import delta_table, local_reference, record_deltas
from raymtl.metrics.divergence import diverged_cell
from raymtl.metrics.report import RESULTS_DROP_ORDER, fit_table
from raymtl.metrics.statistics import without_nan
from raymtl.metrics.tasks import task_table
from raymtl.paths import make_directory

NAN = math.nan


@dataclass(frozen=True)
class Comparison:
    """A finished comparison: its folder, table.csv as a frame, and each experiment's results."""

    out_dir: Path
    table: pd.DataFrame  # table.csv: one row per experiment, each final figure's mean and std
    runs: dict[str, Results]  # experiment name -> its results, in the order they ran
    summaries: list[dict]  # summary.json of the comparison: one summary per experiment


def compare(
    experiments: Iterable[Experiment] = (),
    overrides: Iterable[str] = (),
    out: str | Path | None = None,
    callbacks: Iterable[Callback] = (),
    parallel: int | str = 1,
    max_failures: int | None = None,
    resume: str | Path | None = None,
) -> Comparison:
    """Run every experiment (configs, mappings or YAML paths; `a.b=x,y` in `overrides` fans
    each out) into `out` (default <output.dir>/compare-<time>) and tabulate them.

    `parallel`: 1 runs them one after another here; N (or 'auto': as many as the cluster's
    resources hold) runs every (experiment, seed) as a Ray Tune trial in a placement group
    of its own, N at a time, into the same files (runtime/trials/runs.py); a failed trial is
    retried `max_failures` times from its checkpoint. Callbacks then run here as the trials
    report their rounds; returning True from on_round_end cannot stop a trial.

    `resume`: the folder of an interrupted comparison (no experiments then): its finished
    experiments are kept, the others go on from their last complete checkpoint (or start),
    and the table is made as if nothing had stopped."""
    from raymtl.runtime.trials.plans import parse_parallel
    from raymtl.runtime.trials.runs import DEFAULT_MAX_FAILURES

    parallel = parse_parallel(parallel)
    if resume is not None:
        configs, out = resumed_comparison(resume, list(experiments), list(overrides), out)
    else:
        configs = experiment_configs(list(experiments), list(overrides))
        check_same_setting(configs)
        out = comparison_dir(configs, out)
        (out / PLAN_FILE).write_text(yaml.safe_dump(plan_of(configs), sort_keys=False))
    callbacks = tuple(callbacks)
    if resume is not None and all(finished(out / cfg.name, cfg.seeds) for cfg in configs):
        runs = {cfg.name: results_of(out / cfg.name) for cfg in configs}  # stopped at the table
    elif parallel == 1:
        from raymtl.runtime.actors.pool import reusing_actors

        # One set of actors for every experiment and seed whose layout matches.
        with reusing_actors(any(cfg.runtime.reuse_actors for cfg in configs)):
            runs = {cfg.name: run_or_go_on(cfg, out / cfg.name, callbacks) for cfg in configs}
    else:
        from raymtl.runtime.trials.runs import run_seed_trials

        failures = DEFAULT_MAX_FAILURES if max_failures is None else max_failures
        run_dirs = run_seed_trials(configs, out, parallel, callbacks, failures)
        runs = {name: results_of(run_dir) for name, run_dir in run_dirs.items()}
    return tabulate(configs, runs, out)


def tabulate(configs: list[ExperimentConfig], runs: dict[str, Results], out: Path) -> Comparison:
    """The comparison's files from its finished runs: summary.json, table.csv (and
    table_tasks.csv), Δ% against Local where an arm is Local, the side-by-side figures."""
    summaries = [{**results.summary, "algorithm": name} for name, results in runs.items()]
    reference = local_reference(configs)
    if reference is not None:  # Δ%: each arm's mean relative gain over Local across clients
        run_dirs = {name: results.run_dir for name, results in runs.items()}
        deltas = record_deltas(run_dirs, reference, out)  # also into each run's summary.json
        for summary in summaries:
            summary["delta_vs_local"] = deltas[summary["algorithm"]]
        runs = {
            name: replace(results, summary={**results.summary, "delta_vs_local": deltas[name]})
            for name, results in runs.items()
        }
    summaries = without_nan(summaries)  # null, not a bare NaN (JSON has none)
    (out / "summary.json").write_text(json.dumps(summaries, indent=2))
    table = final_table(summaries)
    table.to_csv(out / "table.csv", index=False)
    if any(summary.get("tasks") for summary in summaries):
        task_final_table(summaries).to_csv(out / "table_tasks.csv", index=False)
    if any(cfg.output.plots for cfg in configs):
        plot_comparison({name: results.run_dir for name, results in runs.items()}, out / "plots")
    return Comparison(out_dir=out, table=table, runs=runs, summaries=summaries)


def report_comparison(out: str | Path) -> Comparison:
    """Summarize every run of the comparison in `out` again from its Parquet files (and
    re-draw its plots), then the comparison's table and figures (`raymtl report`)."""
    from raymtl.metrics import plot_run, summarize
    from raymtl.runtime.storage.run_dirs import load_run_config

    out = Path(out)
    configs = [load_run_config(out / name) for name in comparison_runs(out)]
    for cfg in configs:
        summarize(out / cfg.name, cfg.algorithm.name, cfg.model_dump(mode="json"))
        if cfg.output.plots:
            plot_run(out / cfg.name)
    return tabulate(configs, {cfg.name: results_of(out / cfg.name) for cfg in configs}, out)


def comparison_runs(out: Path) -> list[str]:
    """The experiments of the comparison folder `out`, in the order they ran: from its
    comparison.yaml, or (a comparison made before it was written) its summary.json."""
    if (out / PLAN_FILE).is_file():
        return [cfg.name for cfg in read_plan(out)]
    try:
        names = [summary["algorithm"] for summary in json.loads((out / "summary.json").read_text())]
    except (OSError, ValueError, TypeError, KeyError):
        raise ConfigError(
            f"run_dir: '{out}' has no rounds.parquet (not a finished run) nor a comparison's "
            f"{PLAN_FILE} or summary.json"
        ) from None
    return names


def check_same_setting(configs: list[ExperimentConfig]) -> None:
    """A comparison is only fair on the same data partition and seeds."""
    first = configs[0]
    for other in configs[1:]:
        for field in ("data", "seeds", "rounds", "metrics"):  # metrics: the same target
            if getattr(other, field) != getattr(first, field):
                raise ConfigError(
                    f"{field}: '{other.name}' differs from '{first.name}' (compare needs the same)"
                )
    names = [cfg.name for cfg in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"name: experiments to compare need distinct names, got {names}")


# The comparison's experiments as it started them (compare --resume reads them back).
PLAN_FILE = "comparison.yaml"


def plan_of(configs: list[ExperimentConfig]) -> dict:
    return {"experiments": [cfg.model_dump(mode="json") for cfg in configs]}


def resumed_comparison(
    folder: str | Path, experiments: list, overrides: list, out: str | Path | None
) -> tuple[list[ExperimentConfig], Path]:
    """The experiments of the interrupted comparison in `folder`, and the folder."""
    if experiments or overrides or out is not None:
        raise ConfigError(
            "--resume: give only the comparison folder (its experiments are in its "
            f"{PLAN_FILE}), no experiments, overrides or --out"
        )
    folder = Path(folder)
    if not (folder / PLAN_FILE).is_file():
        raise ConfigError(f"--resume: '{folder}' has no {PLAN_FILE} (not a comparison folder)")
    return read_plan(folder), folder


def read_plan(folder: Path) -> list[ExperimentConfig]:
    """The experiments of `folder`'s comparison.yaml, as the comparison started them."""
    plan = folder / PLAN_FILE
    try:
        raws = yaml.safe_load(plan.read_text())["experiments"]
    except (ValueError, TypeError, KeyError, yaml.YAMLError):
        raws = None
    if not isinstance(raws, list) or not all(isinstance(raw, dict) for raw in raws):
        raise ConfigError(f"{plan}: not a comparison plan raymtl wrote")
    return [parse_config(raw) for raw in raws]


def finished(run_dir: Path, seeds: list[int]) -> bool:
    """Every seed of the run in `run_dir` is done and its summary written."""
    done = [run_dir / "checkpoints" / f"seed{seed}" / "DONE" for seed in seeds]
    return (run_dir / "summary.json").is_file() and all(path.is_file() for path in done)


def run_or_go_on(cfg: ExperimentConfig, run_dir: Path, callbacks) -> Results:
    """Run `cfg` into `run_dir`, or go on with the run already there (a comparison
    resumed): an interrupted one from its last complete checkpoint; a finished one runs
    nothing and is only summarized again."""
    if (run_dir / "config.yaml").is_file():
        return resume_run(run_dir, callbacks=callbacks)
    return run(cfg, callbacks=callbacks, run_dir=run_dir)


def comparison_dir(configs: list[ExperimentConfig], out: str | Path | None) -> Path:
    """A new, empty local folder for the comparison (made here)."""
    if out is None and "://" in configs[0].output.dir:
        raise ConfigError("--out: give a local comparison folder when output.dir is a URI")
    if out is None:
        out = Path(configs[0].output.dir) / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out: '{out}' exists and is not empty; compare writes a new directory")
    return make_directory(out, exist_ok=True)


def final_table(summaries: list[dict]) -> pd.DataFrame:
    """One row per experiment: each final figure's mean and std over seeds, the peak memory
    of the run's processes (bytes, mean over seeds) and, with `metrics.target`, the share of
    seeds that reached it and the rounds, bits and FLOPs they needed (NaN: no seed reached
    it). The FLOPs are `total_flops_mean`/`_std` (raymtl/flops.py). Where a seed's loss
    turned NaN, `diverged` names the seeds and rounds ('seed 0 from round 3'; empty for an
    experiment without any)."""
    rows = []
    with_target = any("target" in summary for summary in summaries)
    diverged = any(summary.get("diverged") for summary in summaries)
    for summary in summaries:
        row = {"experiment": summary["algorithm"]}
        for key, value in summary["final"].items():
            row[f"{key}_mean"], row[f"{key}_std"] = value["mean"], value["std"]
        peak_memory = summary.get("peak_memory")
        row["peak_memory_bytes"] = peak_memory["total_bytes"]["mean"] if peak_memory else NAN
        if with_target:
            row.update(target_columns(summary.get("target")))
        if diverged:
            row["diverged"] = diverged_cell(summary)
        rows.append(row)
    return pd.DataFrame(rows)


def target_columns(target: dict | None) -> dict[str, float]:
    """table.csv's figures of reaching the target: NaN where no seed reached it."""
    columns = {"target_reached": target["reached"] if target else NAN}
    for figure in ("rounds", "bits", "flops"):
        stat = (target or {}).get(figure) or {"mean": NAN, "std": NAN}
        columns[f"target_{figure}_mean"] = stat["mean"]
        columns[f"target_{figure}_std"] = stat["std"]
    return columns


def task_final_table(summaries: list[dict]) -> pd.DataFrame:
    """One row per (experiment, task): each final figure's mean and std over seeds."""
    rows = []
    for summary in summaries:
        for task, figures in summary.get("tasks", {}).items():
            row = {"experiment": summary["algorithm"], "task": task, "metric": figures["metric"]}
            for key, value in figures["final"].items():
                row[f"{key}_mean"], row[f"{key}_std"] = value["mean"], value["std"]
            rows.append(row)
    return pd.DataFrame(rows)


def print_comparison(comparison: Comparison, console: Console) -> None:
    """The comparison's tables as `raymtl compare` prints them, fitted to the console's
    width (`fit_table`: columns wrap or are left out by priority, never cut)."""
    summaries = comparison.summaries
    results = results_table(summaries, title=f"comparison ({len(summaries)} experiments)")
    console.print(fit_table(results, console, RESULTS_DROP_ORDER))
    if any(summary.get("tasks") for summary in summaries):
        console.print(fit_table(task_table(summaries, title="per task"), console))
    if any("delta_vs_local" in summary for summary in summaries):
        console.print(fit_table(delta_table(summaries), console))
    console.print(f"comparison in [bold]{comparison.out_dir}[/]")
