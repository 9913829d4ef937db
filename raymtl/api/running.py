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
    """Continue an interrupted (or failed, once its code is fixed) run from its last complete
    checkpoint and return its results, as `raymtl run --resume RUN_DIR` does.

    `run_dir`: the run directory (a path or a URI); `overrides`: `a.b=value` assignments,
    of which only `rounds` (and `runtime`) may change, and rounds only grow (a finished run
    goes on); `callbacks`: `raymtl.Callback`s, as `raymtl.run`'s: `on_run_start` once,
    `on_round_end` after every round run from the checkpoint on (not the rounds already
    run), `on_run_end` with the run directory once its summary is written."""
    from raymtl.runtime.loop.experiment import resume_experiment  # Ray: only when it runs

    where = resume_experiment(run_dir, overrides=list(overrides), callbacks=tuple(callbacks))
    return results_of(where)
