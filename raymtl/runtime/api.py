"""Run an experiment end to end: Ray start-up, the driver, then summary and plots."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from raymtl.config import ConfigError, ExperimentConfig, dump_config, load_config
from raymtl.metrics import plot_run, summarize
from raymtl.runtime.driver import Driver
from raymtl.runtime.executor import InlineExecutor, RayExecutor
from raymtl.runtime.setup import check_federation
from raymtl.runtime_paths import make_directory

log = logging.getLogger(__name__)


def start_ray(cfg: ExperimentConfig) -> float:
    """Join `runtime.address` or start a local Ray (dashboard on 127.0.0.1); seconds taken."""
    import ray

    if ray.is_initialized():
        return 0.0
    began = time.perf_counter()
    runtime = cfg.runtime
    if runtime.address:  # a cluster: `ray job submit --working-dir .` ships the code
        ray.init(address=runtime.address, log_to_driver=False)
    else:  # a Ray of its own ("local": never a `ray start` head running here); workers use
        # this interpreter, where raymtl is installed
        ray.init(
            address="local",
            num_cpus=runtime.num_cpus,
            include_dashboard=runtime.dashboard,
            dashboard_host="127.0.0.1",
            log_to_driver=False,
        )
    return time.perf_counter() - began


def check_output_dir(cfg: ExperimentConfig) -> None:
    """Inside a `ray job submit` job the working directory is Ray's unpacked copy of the
    code: a relative output.dir would put the results there, and they would go with it."""
    if not Path(cfg.output.dir).is_absolute() and "_ray_pkg_" in str(Path.cwd()):
        raise ConfigError(
            f"output.dir: '{cfg.output.dir}' is relative inside a Ray job (it would land in "
            "Ray's package folder); give an absolute path on storage every node shares"
        )


def new_run_dir(cfg: ExperimentConfig) -> Path:
    """runs/<name>-<timestamp>, made unique if two runs start in the same second."""
    check_output_dir(cfg)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.output.dir) / f"{cfg.name}-{stamp}"
    run_dir, suffix = base, 1
    while run_dir.exists():
        run_dir, suffix = base.with_name(f"{base.name}-{suffix}"), suffix + 1
    return make_directory(run_dir)  # absolute: printed and returned as such


def executor_factory(cfg: ExperimentConfig) -> Callable:
    """A fresh executor per seed, of the configured kind."""
    if cfg.runtime.executor == "inline":
        return lambda: InlineExecutor(cfg.runtime)
    start_ray(cfg)
    return lambda: RayExecutor(cfg.runtime)


def run_experiment(
    cfg: ExperimentConfig,
    run_dir: Path | None = None,
    progress: Callable | None = None,
    stop_after: int | None = None,
) -> Path:
    """Run every seed of `cfg` into a new (or given) run directory; returns it."""
    # A missing dataset or a partition the data cannot give is a one-line ConfigError
    # here, before Ray starts and before an empty run directory is left behind.
    check_federation(cfg)  # partition, tasks and models: what the algorithm can run
    run_dir = make_directory(Path(run_dir), exist_ok=True) if run_dir else new_run_dir(cfg)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return _drive(cfg, run_dir, progress, stop_after)


def resume_experiment(
    run_dir: Path, progress: Callable | None = None, overrides: list[str] = ()
) -> Path:
    """Continue an interrupted run from its last complete checkpoint."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume: '{run_dir}' has no config.yaml (not a run directory)")
    saved = load_config(run_dir / "config.yaml")
    cfg = load_config(run_dir / "config.yaml", list(overrides))
    check_resumable(saved, cfg)
    if cfg.rounds > saved.rounds:  # a longer run: finished seeds go on from their checkpoint
        for done in (run_dir / "checkpoints").glob("seed*/DONE"):
            done.unlink()
        (run_dir / "config.yaml").write_text(dump_config(cfg))
    return _drive(cfg, run_dir, progress, None)


# What a resume may change: the rounds (only more), and where and how it runs (the executors
# give identical results: a run may resume on another machine or cluster).
RESUMABLE_CHANGES = ("rounds", "runtime")


def check_resumable(saved: ExperimentConfig, cfg: ExperimentConfig) -> None:
    """Refuse, in one line naming the field, a resume whose config changed what the run is."""
    if cfg.rounds < saved.rounds:
        raise ConfigError(f"rounds: {cfg.rounds} < {saved.rounds} of the run (it may only grow)")
    before, after = saved.model_dump(mode="json"), cfg.model_dump(mode="json")
    for field, old, new in changed_fields(before, after):
        if field.split(".")[0] not in RESUMABLE_CHANGES:
            raise ConfigError(
                f"{field}: {old!r} in the run, {new!r} now; --resume keeps the run's settings "
                "(only rounds may grow; start a new run instead)"
            )


def changed_fields(before, after, prefix: str = ""):
    """(dotted field, old, new) for every leaf that differs between two config mappings."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            yield from changed_fields(before.get(key), after.get(key), f"{prefix}{key}.")
    elif before != after:
        yield prefix.rstrip("."), before, after


def _drive(cfg, run_dir, progress, stop_after) -> Path:
    driver = Driver(cfg, run_dir, executor_factory(cfg), progress)
    driver.run(stop_after=stop_after)
    if stop_after is None:
        summarize(run_dir, cfg.algorithm.name)
        if cfg.output.plots:
            plot_run(run_dir)
    return run_dir
