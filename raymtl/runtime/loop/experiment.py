"""Run an experiment end to end (every seed, then summary and plots), or resume one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from raymtl.config import ExperimentConfig
from raymtl.runtime.actors.pool import reusing_actors
from raymtl.runtime.executors.launch import executor_factory, start_ray
from raymtl.runtime.executors.planning import start_checked_run
from raymtl.runtime.loop.driver import Driver
from raymtl.runtime.storage.location import Location, is_uri, publish
from raymtl.runtime.storage.run_dirs import finish_run, load_run_config, reopen_run, staging_dir

__all__ = [
    "load_run_config",
    "resume_experiment",
    "run_experiment",
    "staging_dir",
    "start_ray",
]


def run_experiment(
    cfg: ExperimentConfig,
    run_dir: str | Path | None = None,
    progress: Callable | None = None,
    stop_after: int | None = None,
    callbacks=(),
) -> Path | str:
    """Run every seed of `cfg` into a new (or given) run directory: returns it (its URI for
    a run kept at a URI). `progress(seed, round, row)` is called after every round;
    `stop_after` stops (as a crash would) after that round of the first seed."""
    local, store, plan = start_checked_run(cfg, run_dir)  # the first seed's plan, checked
    return _drive(cfg, local, store, progress, stop_after, callbacks, plan)


def resume_experiment(
    run_dir: str | Path,
    progress: Callable | None = None,
    overrides: list[str] = (),
    callbacks=(),
) -> Path | str:
    """Continue an interrupted run from its last complete checkpoint (a finished one, with
    more rounds, from its last)."""
    cfg = load_run_config(run_dir, list(overrides))
    local, store = reopen_run(cfg, run_dir)
    return _drive(cfg, local, store, progress, None, callbacks)


def _drive(
    cfg, run_dir: Path, store: Location, progress, stop_after, callbacks, plan=None
) -> Path | str:
    """Run; returns the run directory (a path), or its URI for a run kept at a URI."""
    driver = Driver(cfg, run_dir, executor_factory(cfg), progress, store, callbacks, plan)
    with reusing_actors(cfg.runtime.reuse_actors):  # one set of actors for every seed
        driver.run(stop_after=stop_after)
    if stop_after is None:
        finish_run(cfg, run_dir, store, callbacks)
    else:
        publish(run_dir, store)
    return store.uri if is_uri(store.uri) else run_dir
