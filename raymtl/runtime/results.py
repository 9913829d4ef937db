"""What executor calls bring back to the round loop: one `PhaseResult` per phase, and an
`Answer` (a value and the hosts lost meanwhile) from every other call.

A lost host is a row `{"host", "node", "during", "participants", "error"}`: a client host the
run went on without (runtime.min_clients_fraction < 1). The round loop records it in the round
it was lost in; a loss the run cannot go on from is a `HostsLost` raised instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raymtl.runtime.router import Envelope


@dataclass
class PhaseResult:
    """Everything one phase produced, over every host that ran it."""

    envelopes: list[Envelope] = field(default_factory=list)  # the participants' outboxes
    tables: list[tuple[str, dict]] = field(default_factory=list)  # (table, row) the steps logged
    holders: dict[str, int] = field(default_factory=dict)  # role -> the client holding it now
    warnings: list[dict] = field(default_factory=list)  # {participant, step, message}
    lost: list[dict] = field(default_factory=list)  # client hosts lost during the phase
    flops: float = 0.0  # the steps' floating-point operations (raymtl/flops.py)

    def add(self, other: PhaseResult) -> None:
        """Take another host's result in (hosts answer in the executor's order)."""
        self.envelopes += other.envelopes
        self.tables += other.tables
        self.holders.update(other.holders)
        self.warnings += other.warnings
        self.lost += other.lost
        self.flops += other.flops


@dataclass(frozen=True)
class Answer:
    """The value of an executor call, and the client hosts lost while it ran."""

    value: Any = None
    lost: list[dict] = field(default_factory=list)
