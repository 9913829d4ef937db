"""Executors: where hosts live. InlineExecutor (one process) and RayExecutor (actors).

Both drive the same `ParticipantHost` code; the executor only decides where a
host runs and how calls to it are made and awaited. Every call returns what it brought
back together with the client hosts lost during it (results.py), so the round loop records
a loss in the round it happened in.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod

from raymtl.algorithms.base import EVERY_CLIENT, Phase, role_of
from raymtl.config import ConfigError, RuntimeConfig
from raymtl.graph.mixing import mixing_from_topology
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
    """Starts hosts, runs phases on them, gathers metrics and checkpoints."""

    def __init__(self, runtime: RuntimeConfig):
        self.runtime = runtime
        self.hosts: dict[str, object] = {}
        self.members: dict[str, tuple[str, ...]] = {}  # host name -> participants
        self.specs: dict[str, HostSpec] = {}
        self.nodes: dict[str, str] = {}  # host name -> the node it runs on
        # min_clients_fraction < 1: the participants of client hosts lost for good.
        self.lost: set[str] = set()
        # Why the client actors hold more clients than runtime.clients_per_actor says (a
        # node was lost and they no longer fit), in one line, and the nodes lost.
        self.replanned: str | None = None
        self.replanned_nodes: list[str] = []
        self.injected: set[str] = set()  # hosts killed by runtime.inject_faults

    @abstractmethod
    def clients_per_actor(self, num_clients: int) -> int: ...

    @abstractmethod
    def peer_mixing(self, kind: str, num_nodes: int, seed: int, params: dict) -> dict: ...

    def share_pools(self, pools: dict) -> dict | None:
        """Make the decoded pools available to every host (None: each host loads its own)."""
        return None

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
        seconds = {"hosts_up_s": self.hosts_up_seconds(up - began), "build_s": 0.0}
        seconds["build_s"] = time.perf_counter() - began - seconds["hosts_up_s"]
        for part in ("setup_s", "checkpoint_s", "warm_up_s"):
            seconds[part] = max((b.get(part, 0.0) for b in builds.values()), default=0.0)
        return seconds

    def hosts_up_seconds(self, started: float) -> float:
        """Seconds until every host answered (Ray: placed and started, `_await_placement`);
        in process, the hosts' construction."""
        return started

    def run_phase(
        self, round_index: int, phase: Phase, inboxes: dict, sampled: tuple[int, ...]
    ) -> PhaseResult:
        """Run a phase on every host holding one of the inboxes' participants."""
        by_host: dict[str, dict] = {}
        host_of = self.host_of()
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

    def client_hosts(self) -> list[str]:
        return [name for name, members in self.members.items() if role_of(members[0]) == "client"]

    def evaluate(self, participants=None) -> Answer:
        """Per-client test metrics from every client host (rows sorted by client); of the
        `participants` only, when given (a sample: eval_fraction)."""
        if participants is None:
            calls = {name: () for name in self.client_hosts()}
        else:
            chosen, calls = set(participants), {}
            for name in self.client_hosts():
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
        host_of = self.host_of()
        every = [e for e in envelopes if e.dst == EVERY_CLIENT]
        mine: dict[str, list[Envelope]] = {name: [] for name in self.client_hosts()}
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

    def state_report(self) -> Answer:
        """Clients' kept state over every client host: bytes resident and spilled."""
        answer = self._call("state_report", {name: () for name in self.client_hosts()})
        total: dict[str, int] = {}
        for report in answer.value.values():
            for key, value in report.items():
                total[key] = total.get(key, 0) + value
        return Answer(total, answer.lost)

    def state(self, participant: str) -> Answer:
        """What `participant` keeps between rounds, fetched from its host (None: no host of
        this federation holds it)."""
        hosts = [name for name, members in self.members.items() if participant in members]
        answer = self._call("state", {name: (participant,) for name in hosts})
        return Answer(next(iter(answer.value.values()), None), answer.lost)

    def settle_nodes(self, nodes, timeout: float) -> list[str]:
        """Wait until each node of `nodes` (where lost hosts ran) is declared dead or is seen
        alive, at most `timeout` seconds; the dead ones (inline: no nodes)."""
        return []

    def torch_sees_gpu(self) -> bool | None:
        """Whether torch sees a GPU where client hosts run (None: not known)."""
        import torch

        return torch.cuda.is_available()

    def gpu_memory(self) -> int | None:
        """Bytes of memory of the GPU a client host trains on (None: none, or not known)."""
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_properties(0).total_memory

    def memory_available(self) -> int:
        """Memory the hosts may use: this machine's (inline), the cluster's (Ray)."""
        from raymtl.runtime.hosts.memory import available_memory

        return available_memory()

    def layout(self) -> dict[str, dict]:
        """Where each host runs (hosts.parquet): its node and actor, the CPUs and GPUs its
        actor asked for, the device its clients train on. In process: the driver's."""
        return {
            name: {
                "node": "driver",
                "actor": "",
                "num_cpus": float("nan"),
                "num_gpus": 0.0,
                "device": spec.device,
            }
            for name, spec in self.specs.items()
        }

    def kill_host(self, name: str) -> None:
        """runtime.inject_faults: kill host `name` as a crashed process would be. In process
        a host cannot be killed (the config refuses inject_faults without Ray)."""
        raise NotImplementedError(f"{type(self).__name__} cannot kill host {name}")

    def peak_memory(self) -> Answer:
        """Peak resident bytes of every host's process (inline: all the same process)."""
        return self._call("peak_memory", {name: () for name in self.hosts})

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
        }
        for table in (self.hosts, self.members, self.specs):
            table.pop(name, None)
        return row

    def participants(self) -> list[str]:
        """Every participant the hosts hold now."""
        return [p for members in self.members.values() for p in members]

    def _positions(self) -> dict[str, int]:
        """Participant -> its place in `participants()`, rebuilt when the hosts change."""
        layout = tuple((name, id(members)) for name, members in self.members.items())
        if getattr(self, "_layout", None) != layout:
            self._layout = layout
            self._position = {p: k for k, p in enumerate(self.participants())}
            self._host = {p: name for name, members in self.members.items() for p in members}
            self._of_role: dict[str, list[str]] = {}
            for participant in self._position:
                self._of_role.setdefault(role_of(participant), []).append(participant)
        return self._position

    def host_of(self) -> dict[str, str]:
        """Participant -> the host holding it now."""
        self._positions()
        return self._host

    def participants_of(self, role: str) -> list[str]:
        """The participants of `role` the hosts hold now, in the hosts' order."""
        self._positions()
        return self._of_role.get(role, [])

    def holds(self, participant: str) -> bool:
        """Whether a host holds `participant` now (a lost host's do not count)."""
        return participant in self._positions()

    def order_of(self, participant: str) -> int:
        """`participant`'s place among `participants()` (the hosts' order)."""
        return self._positions().get(participant, len(self._position))

    def probe(self, directory: str) -> dict[str, bool]:
        """Each host writes `<directory>/<host>` and reports whether it sees the driver's
        marker there (checkpoints.check_shared)."""
        return self._call("probe", {name: (directory, name) for name in self.hosts}).value

    def save(self, directory: str) -> Answer:
        """Every host writes its own participants' state (nothing goes through the driver);
        the value: each host's {file name: sha256} of what it wrote (for the manifest)."""
        return self._call("save", {name: (directory,) for name in self.hosts})

    def shutdown(self, keep: bool = False) -> None:
        """Stop the hosts. `keep`: the federation ended cleanly or rolls back to replay, so
        the processes that still answer may serve the next one (the Ray executor's reuse
        session; in process, nothing to keep)."""
        self._close_hosts()
        self._forget_hosts()

    def _forget_hosts(self) -> None:
        self.hosts.clear()
        self.members.clear()
        self.specs.clear()

    def _close_hosts(self, names: list[str] | None = None) -> None:
        """Client hosts (`names`, or all) remove their spilled state."""
        names = self.client_hosts() if names is None else names
        try:  # spilled client state is local scratch: remove it
            self._call("close", {name: () for name in names})
        except Exception as error:  # a lost host's scratch is gone with its node or process
            log.info("closing hosts: %s", error)


class InlineExecutor(Executor):
    """Hosts are plain objects in this process: for tests, debugging and parity."""

    def clients_per_actor(self, num_clients: int) -> int:
        limit = self.runtime.clients_per_actor
        return num_clients if limit == "auto" else limit

    def peer_mixing(self, kind, num_nodes, seed, params):
        return mixing_from_topology(kind, num_nodes, seed, params)

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
