"""Round callbacks: code of the user's that runs on the driver after every round.

    class PrintAccuracy(raymtl.Callback):
        def on_round_end(self, event):
            print(event.seed, event.round, event.row["mean_accuracy"])

    raymtl.run("jobs/fedavg_digits.yaml", callbacks=[PrintAccuracy()])

A callback sees the round's row of rounds.parquet and, in an evaluated round, its
clients' rows of clients.parquet. Returning True from `on_round_end` stops the seed after
that round (early stopping): the rounds run so far stay in the outputs. The CLI's progress
bar (`raymtl.cli.RoundProgress`) and the MLflow tracker (`raymtl.MLflowCallback`) are
callbacks too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from raymtl.runtime.loop.events import RoundEvent

if TYPE_CHECKING:  # imported for the annotation only: the CLI imports this module at start
    from raymtl.config import ExperimentConfig

__all__ = ["Callback", "RoundEvent"]


class Callback:
    """Hooks the driver calls after every round (and at a run's start and end); every one
    is optional. A `RoundEvent` is what `on_round_end` sees."""

    def on_run_start(self, config: ExperimentConfig, run_dir: Path) -> None:
        """Before the first seed starts (also on --resume). `config` is the validated
        experiment, the same type as `Results.config` (`config.model_dump()`: a dict)."""

    def on_round_end(self, event: RoundEvent) -> bool | None:
        """After every round; return True to stop this seed after it."""

    def on_run_end(self, run_dir: Path) -> None:
        """After the summary (and plots) are written."""
