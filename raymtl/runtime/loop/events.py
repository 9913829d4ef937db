"""What the round loop tells the driver's hooks: a `RoundEvent` after every round, and the
hooks it calls (`RoundHooks`). The user's base class for them is `raymtl.Callback`
(raymtl/api/callbacks.py); the runtime calls whatever object it is given."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class RoundEvent:
    """One finished round (checkpoint included) of one seed."""

    seed: int
    round: int
    rounds: int  # the rounds the run was asked for
    row: dict  # the round's row of rounds.parquet
    clients: list[dict] = field(default_factory=list)  # clients.parquet rows (evaluated rounds)


class RoundHooks(Protocol):
    """The hooks the driver calls on every callback, in this order."""

    def on_run_start(self, config, run_dir: Path) -> None: ...

    def on_round_end(self, event: RoundEvent) -> bool | None: ...

    def on_run_end(self, run_dir: Path) -> None: ...
