"""`raymtl.Federation`: one seed of an experiment, live between calls (a notebook, a
debugger), from whatever a user gives for an experiment."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from raymtl.api.callbacks import Callback
from raymtl.api.experiments import Experiment, experiment_config
from raymtl.runtime.loop.federation import Federation as LiveFederation


class Federation(LiveFederation):
    """One seed's federation, started at once: `run_round()`, `state(client)`, `close()` (or a
    `with` block). See the runtime's `Federation` for what each does.

    `experiment`: an `ExperimentConfig`, a mapping or the path of an experiment file;
    `overrides`: `a.b=value` assignments applied to it, as `raymtl.run`'s; `seed`: one of
    its seeds (default: the first); `run_dir`: a new run directory by default, or an
    existing one to go on with; `callbacks`: `raymtl.Callback`s run after every round."""

    def __init__(
        self,
        experiment: Experiment,
        seed: int | None = None,
        run_dir: str | Path | None = None,
        callbacks: Iterable[Callback] = (),
        *,
        overrides: Iterable[str] = (),
    ):
        super().__init__(experiment_config(experiment, overrides), seed, run_dir, callbacks)
