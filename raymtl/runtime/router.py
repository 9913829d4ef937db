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
    evaluation_only: bool = False  # delivered, never counted (see algorithms.base.Message)
    # An encoded update (runtime/hosts/uplink.py): the payload holds the encoded Δ_k, and
    # `reference` the handle of what it is decoded against (the receiver's own: uncounted).
    reference: Any = None


class Router:
    """Pending envelopes per destination plus a ledger of bits per link."""

    def __init__(self) -> None:
        self._pending: dict[str, list[Envelope]] = defaultdict(list)
        self.ledger: list[dict] = []
        self._row_of: dict[int, dict] = {}  # id(envelope) -> its ledger row
        self._taken: dict[str, list[Envelope]] = {}  # what the last `take` handed over
        self._order: dict[int, int] = {}  # id(evaluation copy) -> when it was delivered

    def deliver(
        self, seed: int, round_index: int, envelopes: list[Envelope], lost: set[str] = frozenset()
    ) -> None:
        """Queue envelopes for their destinations and record their bits; envelopes to a lost
        participant (a client the run goes on without) are dropped, and not counted. The last
        `take` is settled: its envelopes were processed."""
        self._taken = {}
        for envelope in envelopes:
            if envelope.dst in lost:
                continue
            self._pending[envelope.dst].append(envelope)
            if envelope.evaluation_only:
                self._order[id(envelope)] = len(self._order)
                continue
            self._row_of[id(envelope)] = row = {
                "seed": seed,
                "round": round_index,
                "src": envelope.src,
                "dst": envelope.dst,
                "src_role": role_of(envelope.src),
                "dst_role": role_of(envelope.dst),
                "kind": envelope.kind,
                "bits": envelope.bits,
            }
            self.ledger.append(row)

    def waiting(self) -> set[str]:
        """Participants with envelopes waiting for a step (evaluation copies do not count)."""
        return {
            dst for dst, queue in self._pending.items() if any(not e.evaluation_only for e in queue)
        }

    def take(self, participants: list[str]) -> dict[str, list[Envelope]]:
        """Hand the waiting envelopes of `participants` over (they leave the router); an
        evaluation copy is never a step's input: it waits for `take_evaluation`."""
        self._taken = {}
        for participant in participants:
            queue = self._pending.pop(participant, [])
            held = [e for e in queue if e.evaluation_only]
            if held:
                self._pending[participant] = held
            self._taken[participant] = [e for e in queue if not e.evaluation_only]
        return self._taken

    def take_evaluation(self) -> list[Envelope]:
        """The round's evaluation copies in the order they were sent (a copy to EVERY_CLIENT
        is replaced, for one client, by a later copy to it, and replaces the earlier ones)."""
        copies = []
        for dst, queue in list(self._pending.items()):
            copies += [e for e in queue if e.evaluation_only]
            self._pending[dst] = [e for e in queue if not e.evaluation_only]
            if not self._pending[dst]:
                del self._pending[dst]
        return sorted(copies, key=lambda envelope: self._order[id(envelope)])

    def retract(self, participants: set[str]) -> None:
        """The last `take`'s envelopes for `participants` were never processed (their host was
        lost): they were not delivered, so their bits are not counted."""
        for participant in participants:
            for envelope in self._taken.get(participant, []):
                if id(envelope) in self._row_of:
                    self.ledger.remove(self._row_of.pop(id(envelope)))

    def undelivered(self) -> list[Envelope]:
        """Envelopes nobody consumed (should be none at the end of a round)."""
        return [e for queue in self._pending.values() for e in queue]

    def drain_ledger(self) -> list[dict]:
        """The ledger rows recorded since the last drain."""
        rows, self.ledger = self.ledger, []
        self._row_of.clear()
        return rows
