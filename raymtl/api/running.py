"""`raymtl.run` and `raymtl.resume`: an experiment's every seed into a run folder, and an
interrupted run continued; both return its `Results`. `raymtl run` is this with a progress bar
(a `Callback`) and a printed table."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from raymtl.api.callbacks import Callback
from raymtl.api.experiments import Experiment, experiment_config
from raymtl.api.results import Results, results_of


def run(
    experiment: Experiment,
    overrides: Iterable[str] = (),
    callbacks: Iterable[Callback] = (),
    run_dir: str | Path | None = None,
) -> Results:
    """Run every seed of an experiment into a new run directory (or `run_dir`: a path or a
    URI) and return its results once the summary (and plots, unless `output.plots` is
    false) are written. `callbacks` run on this process after every round."""
    from raymtl.runtime.loop.experiment import run_experiment  # Ray: only when something runs

    cfg = experiment_config(experiment, overrides)
    return results_of(run_experiment(cfg, run_dir, callbacks=tuple(callbacks)))


def resume(
    run_dir: str | Path, overrides: Iterable[str] = (), callbacks: Iterable[Callback] = ()
) -> Results:
    """Continue an interrupted run (a path or a URI) from its last complete checkpoint; only
    `rounds` (and `runtime`) may change, and rounds only grow."""
    from raymtl.runtime.loop.experiment import resume_experiment  # Ray: only when it runs

    where = resume_experiment(run_dir, overrides=list(overrides), callbacks=tuple(callbacks))
    return results_of(where)
