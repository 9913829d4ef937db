"""Executors: where hosts live. InlineExecutor (one process) and RayExecutor (actors).

Both drive the same `ParticipantHost` code; the executor only decides where a
host runs and how calls to it are made and awaited.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from raymtl.algorithms.base import Phase, role_of
from raymtl.config import RuntimeConfig
from raymtl.graph.mixing import mixing_from_topology
from raymtl.runtime.host import HostSpec, ParticipantHost
from raymtl.runtime.router import Envelope

log = logging.getLogger(__name__)

# Roles whose state is rebuilt from each round's messages, so a lost host is replaced
# mid-run (no rollback): ColNet's task leaders, a duty that passes between clients anyway.
REHOSTABLE_ROLES = ("leader",)


class HostsLost(RuntimeError):
    """Hosts died during a call and the federation cannot go on without them: the driver
    rolls the whole federation back to its last complete checkpoint and replays."""

    def __init__(self, method: str, hosts: list[str], nodes: dict[str, str], detail: str):
        self.method, self.hosts, self.nodes, self.detail = method, hosts, nodes, detail
        super().__init__(f"hosts lost during {method}: {', '.join(hosts)} ({detail})")


class Executor(ABC):
    """Starts hosts, runs phases on them, gathers metrics and checkpoints."""

    def __init__(self, runtime: RuntimeConfig):
        self.runtime = runtime
        self.hosts: dict[str, object] = {}
        self.members: dict[str, tuple[str, ...]] = {}  # host name -> participants
        self.specs: dict[str, HostSpec] = {}
        self.nodes: dict[str, str] = {}  # host name -> the node it runs on
        # min_clients_fraction < 1: client hosts lost for good, and what was lost since the
        # driver last asked (it records them and drops their messages).
        self.lost: set[str] = set()
        self.dropped: list[dict] = []

    @abstractmethod
    def clients_per_actor(self, num_clients: int) -> int: ...

    @abstractmethod
    def peer_mixing(self, kind: str, num_nodes: int, seed: int, params: dict) -> dict: ...

    def share_pools(self, pools: dict) -> dict | None:
        """Make the decoded pools available to every host (None: each host loads its own)."""
        return None

    @abstractmethod
    def _start_host(self, name: str, role: str, spec: HostSpec): ...

    @abstractmethod
    def _call(self, method: str, calls: dict[str, tuple]) -> dict[str, object]:
        """Call `method(*args)` on each named host, in parallel; results by host."""

    def start(self, specs: dict[str, HostSpec]) -> None:
        """Start one host per spec (named 'clients-0', 'server', 'lps-1', ...)."""
        for name, spec in specs.items():
            self.hosts[name] = self._start_host(name, role_of(spec.participants[0]), spec)
            self.members[name] = spec.participants
            self.specs[name] = spec

    def run_phase(
        self, round_index: int, phase: Phase, inboxes: dict, sampled: tuple[int, ...]
    ) -> tuple[list[Envelope], list[tuple[str, dict]]]:
        """Run a phase on every host holding one of the inboxes' participants.

        Returns the envelopes the participants sent and the rows their steps recorded.
        """
        calls = {}
        for name, participants in self.members.items():
            mine = {p: inboxes[p] for p in participants if p in inboxes}
            if mine:
                calls[name] = (round_index, phase, mine, sampled)
        results = self._call("run_phase", calls)
        envelopes = [e for name in calls for e in results.get(name, ([], []))[0]]
        records = [r for name in calls for r in results.get(name, ([], []))[1]]
        return envelopes, records

    def evaluate(self) -> list[dict]:
        """Per-client test metrics from every client host."""
        calls = {
            name: () for name, members in self.members.items() if role_of(members[0]) == "client"
        }
        results = self._call("evaluate", calls)
        return sorted((row for rows in results.values() for row in rows), key=lambda r: r["client"])

    def hold_for_evaluation(self, envelopes: list[Envelope]) -> None:
        """Hand each client host the evaluation copies for its clients: every distinct
        payload once per host, however many of its clients share it."""
        calls = {}
        for name, participants in self.members.items():
            members = set(participants)
            mine = [e for e in envelopes if e.dst in members]
            if not mine:
                continue
            distinct: dict[int, int] = {}
            payloads = []
            for envelope in mine:
                if id(envelope.payload) not in distinct:
                    distinct[id(envelope.payload)] = len(payloads)
                    payloads.append(envelope.payload)
            calls[name] = (payloads, {e.dst: distinct[id(e.payload)] for e in mine})
        self._call("hold_for_evaluation", calls)

    def state_report(self) -> dict[str, int]:
        """Clients' kept state over every client host: bytes resident and spilled."""
        calls = {name: () for name, members in self.members.items()
                 if role_of(members[0]) == "client"}  # fmt: skip
        total: dict[str, int] = {}
        for report in self._call("state_report", calls).values():
            for key, value in report.items():
                total[key] = total.get(key, 0) + value
        return total

    def memory_available(self) -> int:
        """Memory the hosts may use: this machine's (inline), the cluster's (Ray)."""
        from raymtl.runtime.memory import available_memory

        return available_memory()

    def peak_memory(self) -> dict[str, int]:
        """Peak resident bytes of every host's process (inline: all the same process)."""
        return self._call("peak_memory", {name: () for name in self.hosts})

    def drop(self, name: str, method: str, detail: str) -> None:
        """Go on without client host `name` (its participants are lost for good)."""
        self.lost.update(self.members[name])
        self.dropped.append(
            {"host": name, "node": self.nodes.get(name, "?"), "during": method,
             "participants": list(self.members[name]), "error": detail}
        )  # fmt: skip
        for table in (self.hosts, self.members, self.specs):
            table.pop(name, None)

    def drain_dropped(self) -> list[dict]:
        """Hosts dropped since the last call."""
        dropped, self.dropped = self.dropped, []
        return dropped

    def participants(self) -> list[str]:
        """Every participant the hosts hold now."""
        return [p for members in self.members.values() for p in members]

    def probe(self, directory: str) -> dict[str, bool]:
        """Each host writes `<directory>/<host>` and reports whether it sees the driver's
        marker there (check_shared in driver.py)."""
        return self._call("probe", {name: (directory, name) for name in self.hosts})

    def save(self, directory: str) -> None:
        """Every host writes its own participants' state (nothing goes through the driver)."""
        self._call("save", {name: (directory,) for name in self.hosts})

    def shutdown(self) -> None:
        self._close_hosts()
        self._forget_hosts()

    def _forget_hosts(self) -> None:
        self.hosts.clear()
        self.members.clear()
        self.specs.clear()

    def _close_hosts(self) -> None:
        try:  # spilled client state is local scratch: remove it
            self._call("close", {name: () for name, members in self.members.items()
                                 if role_of(members[0]) == "client"})  # fmt: skip
        except Exception as error:  # a lost host's scratch is gone with its node or process
            log.warning("closing hosts: %s", error)


class InlineExecutor(Executor):
    """Hosts are plain objects in this process: for tests, debugging and parity."""

    def clients_per_actor(self, num_clients: int) -> int:
        limit = self.runtime.clients_per_actor
        return num_clients if limit == "auto" else limit

    def peer_mixing(self, kind, num_nodes, seed, params):
        return mixing_from_topology(kind, num_nodes, seed, params)

    def _start_host(self, name, role, spec):
        return ParticipantHost(spec)

    def _call(self, method, calls):
        return {name: getattr(self.hosts[name], method)(*args) for name, args in calls.items()}
