"""Routes messages between phases and counts every bit that crosses a link.

The router only ever sees `Envelope`s: sender, receiver, kind, size and an
opaque payload handle (a Ray ObjectRef under the RayExecutor). It has no way
to open a payload, so model tensors never materialise in the driver: they go
from the sending actor's object store straight to the receiving actor.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from raymtl.algorithms.base import role_of


@dataclass(frozen=True)
class Envelope:
    """A message in transit: metadata plus an unopened payload handle."""

    src: str
    dst: str
    kind: str
    bits: int
    payload: Any


class Router:
    """Pending envelopes per destination plus a ledger of bits per link."""

    def __init__(self) -> None:
        self._pending: dict[str, list[Envelope]] = defaultdict(list)
        self.ledger: list[dict] = []

    def deliver(self, seed: int, round_index: int, envelopes: list[Envelope]) -> None:
        """Queue envelopes for their destinations and record their bits."""
        for envelope in envelopes:
            self._pending[envelope.dst].append(envelope)
            self.ledger.append(
                {
                    "seed": seed,
                    "round": round_index,
                    "src": envelope.src,
                    "dst": envelope.dst,
                    "src_role": role_of(envelope.src),
                    "dst_role": role_of(envelope.dst),
                    "kind": envelope.kind,
                    "bits": envelope.bits,
                }
            )

    def waiting(self) -> set[str]:
        """Participants with envelopes waiting."""
        return {dst for dst, queue in self._pending.items() if queue}

    def take(self, participants: list[str]) -> dict[str, list[Envelope]]:
        """Hand the waiting envelopes of `participants` over (they leave the router)."""
        return {p: self._pending.pop(p, []) for p in participants}

    def undelivered(self) -> list[Envelope]:
        """Envelopes nobody consumed (should be none at the end of a round)."""
        return [e for queue in self._pending.values() for e in queue]

    def drain_ledger(self) -> list[dict]:
        """The ledger rows recorded since the last drain."""
        rows, self.ledger = self.ledger, []
        return rows
