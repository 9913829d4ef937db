"""Executors: where hosts live. InlineExecutor (one process) and RayExecutor (actors).

Both drive the same `ParticipantHost` code; the executor only starts hosts, calls them and
shuts them down. Every call returns what it brought back together with the client hosts
lost during it (results.py), so the round loop records a loss in the round it happened in.

What is not a call lives beside it, behind what the executor holds: which host holds which
participants (`members`, membership.py), where hosts go (`placement`, placement.py), what
their machines have (`probes`, probes.py), the peer graph (topology.py: on its
`graph_service`), and runtime.inject_faults' kills (runtime/faults.py `kill_host`).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod

from raymtl.algorithms.base import EVERY_CLIENT, Phase, role_of
from raymtl.config import ConfigError, RuntimeConfig
from raymtl.runtime.executors.membership import Membership
from raymtl.runtime.executors.placement import Placement
from raymtl.runtime.executors.probes import Probes
from raymtl.runtime.hosts.host import HostSpec, ParticipantHost
from raymtl.runtime.results import Answer, PhaseResult
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


def build_error(host: str, error: BaseException) -> ConfigError:
    """An error raised while `host` was being built, as one line naming the host: it is the
    configuration's or the node's (a plugin, the data), never a host to recover."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return ConfigError(f"host {host}: {lines[0]}")


class Executor(ABC):
    """Starts hosts, calls them (the round loop's calls), shuts them down."""

    # The actor peer graphs are computed on (topology.py; Ray's graph service); None: here.
    graph_service = None

    def __init__(self, runtime: RuntimeConfig):
        self.runtime = runtime
        self.hosts: dict[str, object] = {}
        self.members = Membership()  # host name -> participants
        self.specs: dict[str, HostSpec] = {}
        self.nodes: dict[str, str] = {}  # host name -> the node it runs on
        # min_clients_fraction < 1: the participants of client hosts lost for good.
        self.lost: set[str] = set()
        self.injected: set[str] = set()  # hosts killed by runtime.inject_faults (faults.py)
        self.placement = Placement(runtime)
        self.probes = Probes()

    @abstractmethod
    def _start_host(self, name: str, role: str, spec: HostSpec):
        """A host for `spec`, not built yet (`_build`)."""

    @abstractmethod
    def _build(self, names: list[str]) -> dict[str, dict]:
        """Build the named hosts; an error raised there is `build_error`'s ConfigError.
        Returns each host's build timings (ParticipantHost.build)."""

    @abstractmethod
    def _call(self, method: str, calls: dict[str, tuple]) -> Answer:
        """Call `method(*args)` on each named host, in parallel: the results by host, and
        the client hosts lost meanwhile."""

    def start(self, specs: dict[str, HostSpec]) -> dict[str, float]:
        """Start one host per spec (named 'clients-0', 'server', 'lps-1', ...) and build it.
        Returns where the seconds went: `hosts_up_s` (the hosts started and answering: an
        actor's process importing torch), `build_s` (all built, in parallel), and the
        slowest host's `setup_s`, `checkpoint_s` and `warm_up_s` (ParticipantHost.build)."""
        began = time.perf_counter()
        for name, spec in specs.items():
            self.hosts[name] = self._start_host(name, role_of(spec.participants[0]), spec)
            self.members[name] = spec.participants
            self.specs[name] = spec
        up = time.perf_counter()
        builds = self._build(list(self.hosts)) or {}
        seconds = {"hosts_up_s": up - began, "build_s": time.perf_counter() - up}
        for part in ("setup_s", "checkpoint_s", "warm_up_s"):
            seconds[part] = max((b.get(part, 0.0) for b in builds.values()), default=0.0)
        return seconds

    def call(self, method: str, calls: dict[str, tuple]) -> Answer:
        """Call `method(*args)` on each named host (`calls`: host name -> args), in
        parallel: the results by host, and the client hosts lost meanwhile."""
        return self._call(method, calls)

    def run_phase(
        self, round_index: int, phase: Phase, inboxes: dict, sampled: tuple[int, ...]
    ) -> PhaseResult:
        """Run a phase on every host holding one of the inboxes' participants."""
        by_host: dict[str, dict] = {}
        host_of = self.members.host_of()
        for participant, inbox in inboxes.items():  # the phase's participants only: not N
            if participant in host_of:
                by_host.setdefault(host_of[participant], {})[participant] = inbox
        calls = {name: (round_index, phase, mine, sampled) for name, mine in by_host.items()}
        answer = self._call("run_phase", calls)
        result = PhaseResult(lost=answer.lost)
        for name in calls:
            if name in answer.value:
                result.add(answer.value[name])
        return result

    def evaluate(self, participants=None) -> Answer:
        """Per-client test metrics from every client host (rows sorted by client); of the
        `participants` only, when given (a sample: eval_fraction)."""
        if participants is None:
            calls = {name: () for name in self.members.client_hosts()}
        else:
            chosen, calls = set(participants), {}
            for name in self.members.client_hosts():
                mine = [p for p in self.members[name] if p in chosen]
                if mine:
                    calls[name] = (mine,)
        answer = self._call("evaluate", calls)
        rows = sorted(
            (row for rows in answer.value.values() for row in rows), key=lambda r: r["client"]
        )
        return Answer(rows, answer.lost)

    def hold_for_evaluation(self, envelopes: list[Envelope]) -> Answer:
        """Hand each client host the evaluation copies for its clients: every distinct
        payload once per host, however many of its clients share it; a copy to EVERY_CLIENT
        goes to every client host as one payload (the clients' own copies over it)."""
        host_of = self.members.host_of()
        every = [e for e in envelopes if e.dst == EVERY_CLIENT]
        mine: dict[str, list[Envelope]] = {name: [] for name in self.members.client_hosts()}
        for envelope in envelopes:
            if envelope.dst != EVERY_CLIENT and envelope.dst in host_of:
                mine.setdefault(host_of[envelope.dst], []).append(envelope)
        calls = {}
        for name, own in mine.items():
            if not own and not every:
                continue
            distinct: dict[int, int] = {}
            payloads = []
            for envelope in every + own:
                if id(envelope.payload) not in distinct:
                    distinct[id(envelope.payload)] = len(payloads)
                    payloads.append(envelope.payload)
            default = distinct[id(every[-1].payload)] if every else None
            calls[name] = (payloads, {e.dst: distinct[id(e.payload)] for e in own}, default)
        return Answer(None, self._call("hold_for_evaluation", calls).lost)

    def save(self, directory: str) -> Answer:
        """Every host writes its own participants' state (nothing goes through the driver);
        the value: each host's {file name: sha256} of what it wrote (for the manifest)."""
        return self._call("save", {name: (directory,) for name in self.hosts})

    def drop(self, name: str, method: str, detail: str) -> dict:
        """Go on without client host `name` (its participants are lost for good); the row
        that says so."""
        self.lost.update(self.members[name])
        row = {
            "host": name,
            "node": self.nodes.get(name, "?"),
            "during": method,
            "participants": list(self.members[name]),
            "error": detail,
            "injected": name in self.injected,
        }
        for table in (self.hosts, self.members, self.specs):
            table.pop(name, None)
        return row

    def shutdown(self, keep: bool = False) -> None:
        """Stop the hosts. `keep`: the federation ended cleanly or rolls back to replay, so
        the processes that still answer may serve the next one (the Ray executor's reuse
        session; in process, nothing to keep)."""
        close_hosts(self, self.members.client_hosts())


def participant_state(executor: Executor, participant: str) -> Answer:
    """What `participant` keeps between rounds, fetched from its host (None: no host of
    the executor holds it)."""
    hosts = [name for name, members in executor.members.items() if participant in members]
    answer = executor.call("state", {name: (participant,) for name in hosts})
    return Answer(next(iter(answer.value.values()), None), answer.lost)


def close_hosts(executor: Executor, names: list[str]) -> None:
    """Client hosts `names` remove their spilled state (local scratch); then the executor
    forgets every host. A lost host's scratch is gone with its node or process."""
    try:
        executor.call("close", {name: () for name in names})
    except Exception as error:
        log.info("closing hosts: %s", error)
    for table in (executor.hosts, executor.members, executor.specs):
        table.clear()


class InlineExecutor(Executor):
    """Hosts are plain objects in this process: for tests, debugging and parity."""

    def _start_host(self, name, role, spec):
        return ParticipantHost(spec)

    def _build(self, names):
        built = {}
        for name in names:
            try:
                built[name] = self.hosts[name].build()
            except Exception as error:
                raise build_error(name, error) from error
        return built

    def _call(self, method, calls):
        results = {name: getattr(self.hosts[name], method)(*args) for name, args in calls.items()}
        return Answer(results)
