"""Experiments as concurrent Ray Tune trials: `raymtl compare --parallel` and `raymtl tune`.

A trial is one Tune function trainable whose resources are a placement group built from the
experiment's runtime settings (`trial_bundles`): an empty head bundle for the trial's
driver (it waits on its hosts, as the sequential driver does outside Ray's accounting) and
one bundle per client actor (num_cpus_per_actor, num_gpus_per_actor). The coordinators
(server, LPSs, task leaders, graph service) take no CPU and are captured into the same
group, so one trial's actors never take another's room. `--parallel auto` runs as many
trials at once as the cluster's CPUs (and GPUs) hold.

A comparison runs one trial per (experiment, seed). Each seed runs with the experiment's
full config (its checkpoints are bound to it) into a staging run directory of its own,
out/.trials/<experiment>-seed<k>; once every seed is done, their tables are concatenated in
the order of `seeds` (the order the sequential driver writes them), their checkpoints moved
into the run directory and the summary written as `raymtl run` writes it: the same files
as the sequential comparison. A trial that fails is restarted by Tune (FailureConfig
max_failures) and goes on from its staging directory's last complete checkpoint, as
`--resume` does.

A sweep (raymtl/api/tuning.py) runs one trial per sampled configuration, on the experiment's
first seed, into <sweep>/trials/<trial id>; each evaluated round reports the metric to
Tune (`TuneReport`), which is what lets ASHA stop a trial early. How many trials run at
once, and the placement group each asks for, is plans.py's.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from raymtl.config import ConfigError, ExperimentConfig, dump_config, parse_config, with_values
from raymtl.runtime.actors.pool import POOL, ray_kill
from raymtl.runtime.faults import RunStopped
from raymtl.runtime.loop.events import RoundEvent, RoundHooks
from raymtl.runtime.trials.plans import ClusterRoom, placement, plan_trials

# Tune runs each trial up to this many times more after a failure (FailureConfig).
DEFAULT_MAX_FAILURES = 2
STAGING = ".trials"  # the comparison's staging folder, removed once the runs are merged


def numeric_metrics(row: dict) -> dict[str, float]:
    """The numbers of a round's row (Tune reports numbers; NaN and None are left out)."""
    metrics = {}
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if isinstance(value, float) and math.isnan(value):
            continue
        metrics[key] = value
    return metrics


class TuneReport:
    """Each round's figures to Tune (`ray.tune.report`): its schedulers (ASHA) and loggers
    see the run round by round. A trial Tune stops early ends inside `report`."""

    def __init__(self, metric: str | None = None):
        self.metric = metric  # rounds without it (not evaluated) are not reported

    def on_run_start(self, config, run_dir: Path) -> None:
        pass

    def on_run_end(self, run_dir: Path) -> None:
        pass

    def on_round_end(self, event: RoundEvent) -> None:
        from ray import tune

        metrics = numeric_metrics(event.row)
        if self.metric is not None and self.metric not in metrics:
            return
        tune.report({**metrics, "seed": event.seed, "round": event.round})


# -- a comparison's trials: one (experiment, seed) each


def seed_trial(config: dict) -> None:
    """Tune's function trainable for one seed of a comparison: run (or go on with, after a
    failure) the seed in its staging run directory, reporting every round."""
    from raymtl.paths import make_directory
    from raymtl.runtime.executors.launch import executor_factory
    from raymtl.runtime.loop.driver import Driver
    from raymtl.runtime.storage.location import Location

    trial = config["trial"]
    os.chdir(trial["cwd"])  # Tune starts a trial in its own folder: relative paths are ours
    cfg = parse_config(trial["experiment"])
    seed, stage = int(trial["seed"]), make_directory(Path(trial["stage"]), exist_ok=True)
    if not (stage / "config.yaml").is_file():
        (stage / "config.yaml").write_text(dump_config(cfg))
    store = Location.of(stage)
    driver = Driver(cfg, stage, executor_factory(cfg), store=store, callbacks=[TuneReport()])
    if not store.child("checkpoints", f"seed{seed}", "DONE").is_file():
        driver.run_seed(seed)  # from the last complete checkpoint after a failure
    driver.recorder.flush()


class RoundRelay:
    """A Tune callback on this process: every round a trial reports goes to the user's
    callbacks, each experiment to its own shallow copy of each (per-run state apart, a
    shared sink such as a progress bar shared)."""

    def __init__(self, callbacks: Iterable[RoundHooks], configs, run_dirs: dict[str, Path]):
        from ray import tune

        class Relay(tune.Callback):
            def __init__(self, relay: RoundRelay):
                self.relay = relay

            def on_trial_result(self, iteration, trials, trial, result, **info):
                if self.relay is not None:
                    self.relay.round_result(trial.config["trial"], result)

            def __getstate__(self):  # Tune saves its callbacks; ours hold locks, a console
                return {"relay": None}

        self.tune_callback = Relay(self)
        self.callbacks = tuple(callbacks)
        self.configs = {cfg.name: cfg for cfg in configs}
        self.run_dirs = run_dirs
        self.copies: dict[str, tuple[RoundHooks, ...]] = {}

    def of(self, name: str) -> tuple[RoundHooks, ...]:
        """The experiment's copies of the callbacks (their on_run_start called once)."""
        if name not in self.copies:
            self.copies[name] = tuple(copy.copy(callback) for callback in self.callbacks)
            for callback in self.copies[name]:
                callback.on_run_start(self.configs[name], self.run_dirs[name])
        return self.copies[name]

    def round_result(self, trial: dict, result: dict) -> None:
        name = trial["name"]
        if "round" not in result or not self.callbacks:
            return
        cfg = self.configs[name]
        row = {key: value for key, value in result.items() if key in ROUND_KEYS}
        event = RoundEvent(int(trial["seed"]), int(result["round"]), cfg.rounds, row)
        for callback in self.of(name):
            callback.on_round_end(event)  # a stop cannot reach a trial: see compare()


def round_keys() -> frozenset[str]:
    from raymtl.metrics.recorder import ROUNDS_SCHEMA

    return frozenset(ROUNDS_SCHEMA.names)


ROUND_KEYS = round_keys()


def trial_error(error: BaseException | None) -> BaseException | None:
    """The error a trial raised, out of Ray's and Tune's wrappers."""
    while error is not None and getattr(error, "cause", None) is not None:
        error = error.cause
    return error


def raise_trial_failure(label: str, error: BaseException) -> None:
    """A failed trial (Tune's retries used up) as the CLI's one-line errors."""
    error = trial_error(error)
    line = " ".join(str(error).split())[:300] or type(error).__name__
    if isinstance(error, ConfigError):
        raise ConfigError(line) from None
    raise RunStopped(f"{label}: failed after Tune's retries: {line}") from None


def run_seed_trials(
    configs: list[ExperimentConfig],
    out: Path,
    parallel: int | str,
    callbacks: Iterable[RoundHooks] = (),
    max_failures: int = DEFAULT_MAX_FAILURES,
) -> dict[str, Path]:
    """Every (experiment, seed) of a comparison as a Tune trial, then each experiment's run
    directory out/<name> as the sequential comparison writes it; name -> run directory."""
    from ray import tune

    from raymtl.runtime.executors.launch import start_ray
    from raymtl.runtime.executors.planning import start_checked_run
    from raymtl.runtime.storage.run_dirs import finish_run

    start_ray(configs[0], join_up=False)  # trials' placement groups need the CPUs
    run_dirs = {cfg.name: start_checked_run(cfg, out / cfg.name)[0] for cfg in configs}
    stages = out / STAGING
    trials = [
        {
            "name": cfg.name,
            "seed": seed,
            "experiment": cfg.model_dump(mode="json"),
            "stage": str((stages / f"{cfg.name}-seed{seed}").resolve()),
            "cwd": os.getcwd(),
        }
        for cfg in configs
        for seed in cfg.seeds
    ]
    in_flight, plans = plan_trials(configs, len(trials), parallel, ClusterRoom.now())
    relay = RoundRelay(callbacks, configs, run_dirs)
    trainable = tune.with_resources(
        seed_trial, resources=lambda config: placement(plans[config["trial"]["name"]])
    )
    results = run_tuner(
        trainable,
        {"trial": tune.grid_search(trials)},
        tune.TuneConfig(
            max_concurrent_trials=in_flight,
            trial_dirname_creator=lambda trial: (
                f"{trial.config['trial']['name']}-seed{trial.config['trial']['seed']}"
            ),
        ),
        failure_config=tune.FailureConfig(max_failures=max_failures),
        callbacks=[relay.tune_callback],
    )
    for result in results:
        if result.error is not None:
            trial = result.config["trial"]
            raise_trial_failure(f"{trial['name']} seed {trial['seed']}", result.error)
    unfinished = [
        f"{cfg.name} seed {seed}"
        for cfg in configs
        for seed in cfg.seeds
        if not (
            stages / f"{cfg.name}-seed{seed}" / "checkpoints" / f"seed{seed}" / "DONE"
        ).is_file()
    ]
    if unfinished:  # Tune was stopped (Ctrl-C): nothing is merged, the staging runs stay
        raise RunStopped(
            f"compare --parallel: not finished: {', '.join(unfinished)}; "
            f"`raymtl compare --resume {out} --parallel {parallel}` goes on from their checkpoints"
        )
    for cfg in configs:
        seed_dirs = [stages / f"{cfg.name}-seed{seed}" for seed in cfg.seeds]
        merge_seed_runs(seed_dirs, run_dirs[cfg.name], cfg.seeds)
        finish_run(cfg, run_dirs[cfg.name], location_of(run_dirs[cfg.name]), relay.of(cfg.name))
    shutil.rmtree(stages, ignore_errors=True)
    return run_dirs


def location_of(run_dir: Path):
    from raymtl.runtime.storage.location import Location

    return Location.of(run_dir)


def run_tuner(trainable, param_space: dict, tune_config, storage: Path | None = None, **run_kw):
    """Run a Tuner quietly (our own tables are printed) with Tune's state in `storage`
    (default: a temporary folder, removed after); its ResultGrid."""
    from ray import tune

    run_kw.setdefault("verbose", 0)
    # Tune's newer console output prints its settings box even at verbose 0.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    keep = storage is not None
    storage = Path(storage) if keep else Path(tempfile.mkdtemp(prefix="raymtl-tune-"))
    # The trials start actors of their own: actors a reuse session of this process keeps
    # idle would hold the CPUs the trials' placement groups wait for.
    POOL.keep_only(Counter(), ray_kill)
    try:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune_config,
            run_config=tune.RunConfig(storage_path=str(storage.resolve()), **run_kw),
        )
        return tuner.fit()
    finally:
        if not keep:
            shutil.rmtree(storage, ignore_errors=True)


def merge_seed_runs(seed_dirs: list[Path], run_dir: Path, seeds: list[int]) -> None:
    """Each seed's staging run into the experiment's run directory: every table the rows of
    the seeds in `seeds` order, as the sequential driver appends them; the checkpoints
    moved (their manifests hold no paths)."""
    from raymtl.metrics.recorder import SCHEMAS, parquet_path, read_parquet_or_empty
    from raymtl.metrics.recorder import write_parquet_atomically as write

    names = sorted({path.stem for folder in seed_dirs for path in folder.glob("*.parquet")})
    for name in sorted(set(names) | set(SCHEMAS)):
        parts = []
        for folder in seed_dirs:
            path = parquet_path(folder, name)
            if name in SCHEMAS:
                parts.append(read_parquet_or_empty(path, SCHEMAS[name]))
            elif path.is_file():
                parts.append(pq.read_table(path))
        table = pa.concat_tables(parts, promote_options="default").combine_chunks()
        if name in SCHEMAS or table.num_rows:
            write(table, parquet_path(run_dir, name))
    for folder, seed in zip(seed_dirs, seeds, strict=True):
        source = folder / "checkpoints" / f"seed{seed}"
        if source.is_dir():
            target = run_dir / "checkpoints" / f"seed{seed}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(source), str(target))


# -- a sweep's trials (raymtl/api/tuning.py): one sampled configuration each


def search_space(kind: str, values: tuple):
    """A `--param` kind as Tune's search space: grid -> grid_search, choice -> choice,
    uniform / loguniform / randint(low, high) -> the Tune function of that name."""
    from ray import tune

    if kind == "grid":
        return tune.grid_search(list(values))
    if kind == "choice":
        return tune.choice(list(values))
    return getattr(tune, kind)(*values)


def make_scheduler(name: str, rounds: int):
    """FIFO, or ASHA on the round: rungs at rounds 1, 2, 4, ... halve the trials."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if name == "asha":
        return ASHAScheduler(time_attr="round", max_t=rounds, grace_period=1, reduction_factor=2)
    return FIFOScheduler()


def sweep_trial(config: dict, sweep: dict) -> None:
    """Tune's function trainable of a sweep: the experiment with the trial's values, on
    its first seed, into trials/<trial id>, reporting the metric every round."""
    from ray import tune

    from raymtl.runtime.loop.experiment import run_experiment

    os.chdir(sweep["cwd"])  # Tune starts a trial in its own folder: relative paths are ours
    raw = with_values(sweep["base"], config["params"])
    raw["seeds"] = sweep["seeds"]
    run_experiment(
        parse_config(raw),
        Path(sweep["out"]) / "trials" / tune.get_context().get_trial_id(),
        callbacks=(TuneReport(sweep["metric"]),),
    )


def run_sweep(
    sweep: dict,
    spaces: dict,
    bundles: list[dict[str, float]],
    in_flight: int,
    *,
    samples: int,
    scheduler: str,
    rounds: int,
    mode: str,
    max_failures: int,
    callbacks: list,
    run_config: dict,
):
    """A sweep's trials through Tune, its logs in <out>/tune; Tune's ResultGrid. `sweep`:
    what every trial shares (the experiment, the metric, the sweep folder)."""
    from ray import tune

    trainable = tune.with_resources(
        tune.with_parameters(sweep_trial, sweep=sweep), placement(bundles)
    )
    return run_tuner(
        trainable,
        {"params": spaces},
        tune.TuneConfig(
            metric=sweep["metric"],
            mode=mode,
            num_samples=samples,
            max_concurrent_trials=in_flight,
            scheduler=make_scheduler(scheduler, rounds),
        ),
        storage=Path(sweep["out"]) / "tune",
        name="sweep",
        failure_config=tune.FailureConfig(max_failures=max_failures),
        callbacks=callbacks,
        **run_config,
    )
