"""`raymtl.Federation`: one seed of an experiment, live between calls (a notebook, a
debugger), from whatever a user gives for an experiment.

It is a run of its own: it opens its run folder (a new one, checked before anything starts,
or an existing one to go on with), calls the callbacks' `on_run_start`, and once its seed is
done writes the run's summary and plots. The rounds, the hosts and their recovery are the
runtime's federation (raymtl/runtime/loop/federation.py), which it holds; only the names
below are public.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from raymtl.api.callbacks import Callback, RoundEvent
from raymtl.api.experiments import Experiment, experiment_config
from raymtl.config import ConfigError, ExperimentConfig
from raymtl.runtime.executors.planning import start_checked_run
from raymtl.runtime.loop.federation import Federation as LiveFederation
from raymtl.runtime.storage.location import Location
from raymtl.runtime.storage.run_dirs import finish_run, reopen_run

__all__ = ["Federation"]


class Federation:
    """One seed's federation, started at once: `run_round()`, `state(participant)` (a
    client's, or the server's model), `close()` (or a `with` block).

        with raymtl.Federation("jobs/fedavg_digits.yaml", overrides=["rounds=3"]) as fed:
            while not fed.done:
                event = fed.run_round()              # event.row: the round's figures
            global_model = fed.state("server")["model"]   # the server's state_dict
            client_3 = fed.state(3)                  # what client 3 keeps between rounds

    `experiment`: an `ExperimentConfig`, a mapping or the path of an experiment file;
    `overrides`: `a.b=value` assignments applied to it, as `raymtl.run`'s; `seed`: one of
    its seeds (default: the first); `run_dir`: a new run directory by default, or an
    existing one to go on with (its config may only change as `--resume` allows; a seed
    finished there is refused, unless `overrides` give it more rounds); `callbacks`:
    `raymtl.Callback`s: `on_run_start` before the hosts start, `on_round_end` after every
    round (True stops the seed), `on_run_end` after the summary, once the seed is done and
    the federation closed."""

    def __init__(
        self,
        experiment: Experiment,
        seed: int | None = None,
        run_dir: str | Path | None = None,
        callbacks: Iterable[Callback] = (),
        *,
        overrides: Iterable[str] = (),
    ):
        cfg = experiment_config(experiment, overrides)
        seed = cfg.seeds[0] if seed is None else int(seed)
        callbacks = tuple(callbacks)
        plan = None
        if run_dir is not None and Location.of(run_dir).child("config.yaml").is_file():
            run_dir, store = reopen_run(cfg, run_dir)
        else:
            run_dir, store, plan = start_checked_run(cfg, run_dir)
        if store.child("checkpoints", f"seed{seed}", "DONE").is_file():
            raise ConfigError(
                f"seed: {seed} of {store.uri} has finished (checkpoints/seed{seed}/DONE); "
                "resume the run with more rounds to go on"
            )
        for callback in callbacks:
            callback.on_run_start(cfg, Path(run_dir))
        self._live = LiveFederation(cfg, seed, run_dir, callbacks, store=store, plan=plan)

    @property
    def cfg(self) -> ExperimentConfig:
        """The validated experiment (overrides applied)."""
        return self._live.cfg

    @property
    def seed(self) -> int:
        """The seed this federation runs."""
        return self._live.seed

    @property
    def run_dir(self) -> Path:
        """The run directory it records into (for a run kept at a URI: its local copy)."""
        return self._live.run_dir

    @property
    def round(self) -> int:
        """The last round finished (0 before the first; the checkpoint's, once resumed)."""
        return self._live.round

    @property
    def done(self) -> bool:
        """Every round has run, or a callback stopped the seed."""
        return self._live.done

    def run_round(self) -> RoundEvent:
        """Run the next round (a lost host is recovered from inside it): its `RoundEvent`,
        after the callbacks' on_round_end. Raises RuntimeError once `done` or closed."""
        return self._live.run_round()

    def state(self, participant: int | str) -> dict:
        """What `participant` keeps between rounds, fetched from its host as it is after the
        last round run: `{"model": a state_dict of CPU tensors, or None, "extras": a dict}`.

        `participant`: a client's index (`3`, or its name "client/3"), or a coordinator's
        name: "server" (FedAvg and every star algorithm: `["model"]` is the global model),
        "lps/0" (hierarchical topologies), "graph" and "leader/<group>" where the algorithm
        has them. A client of an algorithm that keeps no model of its own (FedAvg's clients
        train the server's each round) gives `{"model": None, "extras": {}}`. A name no host
        of this federation holds raises KeyError."""
        return self._live.state(participant)

    def close(self, finish: bool = True) -> None:
        """Stop the hosts. A seed that is `done` is finished (with `finish`: its last
        checkpoint, DONE), then the run's summary and plots are written and the callbacks'
        on_run_end called; a seed not done stays open to go on from (`run_dir=`)."""
        live = self._live
        if live.close(finish):
            finish_run(live.cfg, live.run_dir, live.store, live.callbacks)

    def __enter__(self) -> Federation:
        return self

    def __exit__(self, *exc) -> None:
        self.close(finish=exc[0] is None)

    def __repr__(self) -> str:
        return (
            f"raymtl.Federation(seed={self.seed}, round={self.round} of {self.cfg.rounds}, "
            f"run_dir='{self.run_dir}')"
        )
