"""The Driver: every seed of an experiment, one live `Federation` after another.

for seed in seeds (those not finished yet: checkpoints/seed<k>/DONE):
    with Federation(cfg, seed, ...) as fed:
        while not fed.done:
            event = fed.run_round()     # the callbacks' on_round_end run inside it
            progress(seed, event.round, event.row)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from raymtl.config import ExperimentConfig
from raymtl.metrics import Recorder
from raymtl.runtime.executors.executor import Executor
from raymtl.runtime.executors.planning import Plan
from raymtl.runtime.loop.federation import Federation
from raymtl.runtime.storage.location import Location, publish


class Driver:
    """Runs one experiment (all seeds) into a run directory."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        make_executor: Callable[[], Executor],
        progress=None,
        store: Location | None = None,
        callbacks=(),
        plan: Plan | None = None,
    ):
        self.cfg = cfg
        self.run_dir = Path(run_dir)  # the driver's outputs, written here first
        # Where the run lives (checkpoints written there by the hosts, outputs copied there):
        # the run directory itself, or a URI.
        self.store = store or Location.of(self.run_dir)
        self.make_executor = make_executor
        self.progress = progress  # callable(seed, round, row) or None
        self.callbacks = tuple(callbacks)
        self.recorder = Recorder.load(self.run_dir)
        # The first seed's plan, made by the run's pre-flight check: handed to its federation.
        self.plan = plan

    def run(self, stop_after: int | None = None) -> None:
        """Run (or resume) every seed; `stop_after` simulates a crash after that round."""
        for callback in self.callbacks:
            callback.on_run_start(self.cfg, self.run_dir)
        for seed in self.cfg.seeds:
            if self.store.child("checkpoints", f"seed{seed}", "DONE").is_file():
                continue
            self.run_seed(seed, stop_after)
            if stop_after is not None:
                return
        self.recorder.flush()
        publish(self.run_dir, self.store)

    def run_seed(self, seed: int, stop_after: int | None = None) -> None:
        """One seed to its end (or to a callback's stop), from its last complete checkpoint."""
        plan, self.plan = self.plan, None  # the federation keeps it; the driver, none
        with Federation(
            self.cfg,
            seed,
            self.run_dir,
            self.callbacks,
            store=self.store,
            recorder=self.recorder,
            make_executor=self.make_executor,
            plan=plan,
        ) as federation:
            while not federation.done:
                event = federation.run_round()
                if self.progress is not None:  # the round is complete, checkpoint included
                    self.progress(seed, event.round, event.row)
                if stop_after is not None and event.round >= stop_after:
                    federation.close(finish=False)  # as a crash would: the seed stays open
                    return
