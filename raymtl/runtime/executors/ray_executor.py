"""The RayExecutor: hosts as Ray actors with fractional resources; payloads stay in the
object store. A lost host raises `HostsLost` (the federation rolls back), or is dropped for
good while enough clients answer (runtime.min_clients_fraction). An error raised while an
actor is built is a `ConfigError` naming the host: replaying would only raise it again.

Where the actors go is its `placement` (placement.py `RayPlacement`: the nodes alive, the
layout after a lost node, the autoscaler), what a client actor's GPU share sees its `probes`
(probes.py `RayProbes`). Actors Ray cannot place within runtime.placement_timeout_s stop
the run in one line (`RunStopped`), never a silent hang.

Actors are reused: inside a reuse session (runtime/actors/pool.py: the seeds of a run, the
experiments of a sequential compare) an executor takes idle actors of the kind it needs and
`attach`es them to its specs, and one shut down after a clean federation or for a rollback
(`keep`) hands back the actors that still answer instead of killing them: a replay starts
new actors only for the hosts it lost.

The graph service's actor (`graph_service`) computes peer graphs (topology.py) and hosts
the algorithm's graph participant; runtime.inject_faults' kill is runtime/faults.py's
`kill_host`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter

from raymtl.algorithms.base import role_of
from raymtl.config import RuntimeConfig
from raymtl.errors import StepFailed
from raymtl.runtime.actors.classes import GRAPH_KIND, start_actor
from raymtl.runtime.actors.pool import POOL, ActorKind
from raymtl.runtime.executors.executor import (
    REHOSTABLE_ROLES,
    Executor,
    HostsLost,
    build_error,
    close_hosts,
)
from raymtl.runtime.executors.placement import (
    RayPlacement,
    actor_needs_of,
    alive_nodes,
    nodes_have,
    trial_group_strategy,
)
from raymtl.runtime.executors.probes import RayProbes
from raymtl.runtime.faults import RunStopped
from raymtl.runtime.results import Answer

log = logging.getLogger(__name__)


class RayExecutor(Executor):
    """Hosts are Ray actors with fractional resources; payloads stay in the object store."""

    def __init__(self, runtime: RuntimeConfig, nodes_at_start: dict | None = None):
        super().__init__(runtime)
        import ray

        self._ray = ray
        # Actors come from (and go back to) the reuse session's pool: never in a Tune trial
        # (its placement group ends with it) nor while the autoscaler is asked for nodes.
        self.pooling = (
            runtime.reuse_actors
            and POOL.active
            and not runtime.autoscale
            and trial_group_strategy() is None
        )
        self.kinds: dict[str, ActorKind] = {}  # host name -> the kind of its actor
        self._attaching: dict[str, object] = {}  # host name -> its pending `attach` call
        self.placement = RayPlacement(runtime, ray, nodes_at_start)
        self.probes = RayProbes(ray, runtime)
        # Named actors (raymtl-<run tag>-<host>) show up readably in the dashboard and
        # `ray list actors`; the tag keeps concurrent runs on one cluster apart.
        self.tag = uuid.uuid4().hex[:8]
        self._placement_s = 0.0  # the wait for the actors to come up (`_build`)
        self._graph = None  # the graph service's actor, started when first asked for
        self.rehosted: dict[str, int] = {}  # host name -> replacements so far
        self.placed: set[str] = set()  # hosts whose actors Ray has started
        self.layout_hosts: frozenset[str] = frozenset()  # the hosts `start` was given

    @property
    def graph_service(self):
        """The graph service's actor: peer topologies and the algorithm's graph steps. Started
        (or taken from the reuse session) on first use: a federation without a peer graph or
        a graph participant never starts its process."""
        if self._graph is None:
            self._graph = self.pooling and POOL.take(GRAPH_KIND, "graph")
            if not self._graph:
                self._graph = start_actor(GRAPH_KIND, f"raymtl-{self.tag}-graph")
        return self._graph

    def actor_kind(self, role: str) -> ActorKind:
        """The kind of actor a host of `role` runs in: clients take runtime's CPUs and GPUs;
        coordinators are light and must not take a CPU slot from the clients."""
        if role == "graph":
            return GRAPH_KIND
        if role == "client":
            runtime = self.runtime
            return ActorKind(role, runtime.num_cpus_per_actor, runtime.num_gpus_per_actor)
        return ActorKind(role, 0.0, 0.0)

    def _start_host(self, name, role, spec):
        kind = self.kinds[name] = self.actor_kind(role)
        if role == "graph":  # the graph service also hosts the algorithm's graph steps
            self._attaching[name] = self.graph_service.attach.remote(spec)
            return self.graph_service
        reused = self.pooling and POOL.take(kind, name, self.layout_hosts)
        if reused:  # an actor of the last federation: given this one's spec
            self._attaching[name] = reused.attach.remote(spec)
            return reused
        options = {}
        if role == "client":
            options["scheduling_strategy"] = trial_group_strategy() or "SPREAD"
        return start_actor(kind, f"raymtl-{self.tag}-{name}", spec, **options)

    def _build(self, names):
        """Build every named actor in parallel. An exception raised by `build`, or by the
        actor's creation (its spec could not be unpickled there), is the configuration's or
        the node's: one ConfigError line. An actor that died otherwise is a lost host."""
        began = time.perf_counter()
        self._await_placement(names)
        self._placement_s = time.perf_counter() - began
        refs = {name: self.hosts[name].build.remote() for name in names}
        failed, detail, built = [], "", {}
        attaching = [(name, self._attaching.pop(name)) for name in names if name in self._attaching]
        for name, ref in attaching:  # the spec handed to the graph service or a kept actor
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayTaskError as error:  # the spec did not unpickle
                raise build_error(name, error.cause or error) from error
        refused = None  # the first build error: raised once every build has answered, so
        # that no other's error is left unread (Ray prints those as "Unhandled error" tracebacks)
        for name, ref in refs.items():
            try:
                built[name] = self._ray.get(ref)
            except self._ray.exceptions.RayTaskError as error:
                refused = refused or (build_error(name, error.cause or error), error)
            except self._ray.exceptions.RayActorError as error:
                if error.actor_init_failed:
                    refused = refused or (build_error(name, creation_error(error)), error)
                    continue
                failed.append(name)
                detail = detail or one_line(error)[:200]
        if refused is not None:
            raise refused[0] from refused[1]
        if failed:
            nodes = {name: self.nodes.get(name, "?") for name in failed}
            raise HostsLost("build", failed, nodes, detail)
        return built

    def _await_placement(self, names) -> None:
        """Wait until every named actor answers `ping` (Ray placed it and its process
        started). runtime.placement_timeout_s bounds only the wait for room: an actor Ray has
        placed is waited for however long its process takes to start (importing torch on a
        busy machine); the run stops in one line once the timeout passes with actors still
        unplaced and none placed meanwhile (a large layout starts its actors one after
        another)."""
        timeout = self.runtime.placement_timeout_s
        pings = {self.hosts[name].ping.remote(): name for name in names}
        waiting = list(pings)
        deadline = time.monotonic() + timeout
        while waiting:
            ready, waiting = self._ray.wait(waiting, num_returns=len(waiting), timeout=1.0)
            self.placed.update(pings[ref] for ref in ready)
            if ready or any(actor_has_a_worker(self.hosts[pings[ref]]) for ref in waiting):
                deadline = time.monotonic() + timeout
            elif time.monotonic() >= deadline:
                break
        if not waiting:
            return
        unplaced = sorted(pings[ref] for ref in waiting)
        alive, gone = alive_nodes(self._ray), self.placement.nodes_lost()
        after = f" after node {', '.join(gone)} was lost" if gone else ""
        raise RunStopped(
            f"runtime: {len(unplaced)} of {len(pings)} actors ({', '.join(unplaced)}; a client "
            f"actor takes {actor_needs_of(self.runtime)}) not placed within "
            f"runtime.placement_timeout_s: {timeout:g} s; the nodes alive{after} have "
            f"{nodes_have(alive, self.runtime.num_gpus_per_actor > 0)}"
        )

    def _call(self, method, calls):
        refs = {
            name: getattr(self.hosts[name], method).remote(*args) for name, args in calls.items()
        }
        results, failed, detail, step_failed = {}, [], "", None
        for name, ref in refs.items():
            try:
                results[name] = self._ray.get(ref)
            except self._ray.exceptions.ObjectLostError as error:
                # The host is alive but a payload it was handed died with its sender's host
                # (e.g. a task leader lost between its two steps): nothing to go on with, so
                # the federation rolls back.
                detail = one_line(error)[:200]
                raise HostsLost(method, [name], {name: self.nodes.get(name, "?")}, detail) from None
            except self._ray.exceptions.RayActorError as error:
                # One line: faults.parquet and the federation's warning tell the rest.
                log.info("host %s failed during %s: %s", name, method, one_line(error))
                if role_of(self.members[name][0]) in REHOSTABLE_ROLES:
                    results[name] = self._rehost(name, method, calls[name])
                else:
                    failed.append(name)
                    detail = detail or one_line(error)[:200]
            except self._ray.exceptions.RayTaskError as error:
                if not isinstance(error.cause, StepFailed):
                    raise
                # The algorithm's code raised: its line, once every host has answered (Ray
                # prints an error nobody fetched as an "Unhandled error" traceback).
                step_failed = step_failed or error.cause
        if step_failed is not None:
            raise step_failed from None
        return Answer(results, self._check_quorum(method, calls, failed, detail))

    def _rehost(self, name: str, method: str, args: tuple):
        """Start a new host for a lost one whose roles can move (a task leader) and repeat
        the call there; the algorithm's `rehost` decides who takes the role over."""
        self.rehosted[name] = self.rehosted.get(name, 0) + 1
        self.placement.settle_nodes([self.nodes.get(name, "?")], self.runtime.placement_timeout_s)
        spec = self.specs[name]
        role = role_of(spec.participants[0])
        replacement = f"{name}-r{self.rehosted[name]}"
        handle = self._start_host(replacement, role, spec)
        self.hosts[name] = handle
        if replacement in self._attaching:  # a kept actor: awaited under the host's name
            self._attaching[name] = self._attaching.pop(replacement)
        self._build([name])
        self._ray.get(handle.rehost.remote())
        log.warning("host %s replaced (%d); repeating %s", name, self.rehosted[name], method)
        return self._ray.get(getattr(handle, method).remote(*args))

    def _check_quorum(self, method: str, calls: dict, failed: list[str], detail: str) -> list:
        """A call proceeds when enough of the participants it reached answered: the hosts it
        goes on without (dropped for good), or HostsLost."""
        if not failed:
            return []
        reached = sum(len(self.members[name]) for name in calls)
        lost = sum(len(self.members[name]) for name in failed)
        coordinator = any(role_of(self.members[name][0]) != "client" for name in failed)
        if coordinator or reached - lost < self.runtime.min_clients_fraction * reached:
            nodes = {name: self.nodes.get(name, "?") for name in failed}
            answered = f"only {reached - lost} of {reached} participants answered"
            raise HostsLost(method, failed, nodes, f"{answered}; {detail}")
        return [self.drop(name, method, detail) for name in failed]

    def start(self, specs) -> dict[str, float]:
        self.layout_hosts = frozenset(specs)  # each takes the idle actor it had, if any
        if self.pooling:  # idle actors this layout cannot use would hold its CPUs
            needed = Counter(
                self.actor_kind(role_of(spec.participants[0])) for spec in specs.values()
            )
            POOL.borrow(needed)  # from `raymtl up`'s warm actors, when joined to it
            POOL.keep_only(needed, self._ray.kill, self.layout_hosts)
        else:  # starting actors of its own (runtime.reuse_actors false, autoscaling)
            POOL.keep_only(Counter(), self._ray.kill)  # idle ones would hold their CPUs
            if POOL.lender is not None:  # joined: the same of the service's idle actors
                POOL.lender.make_room()
        if self.runtime.autoscale:
            clients = sum(role_of(spec.participants[0]) == "client" for spec in specs.values())
            self.placement.request_room(clients)
        seconds = super().start(specs)
        # The actors' creation, then the wait until every one answered (`_build`).
        seconds["hosts_up_s"] += self._placement_s
        seconds["build_s"] -= self._placement_s
        # Where each actor runs (faults.parquet names the node of a lost host).
        self.nodes = self._call("node", {name: () for name in self.hosts}).value
        return seconds

    def shutdown(self, keep: bool = False):
        """Stop the hosts: their actors are killed, or with `keep` (a federation that ended
        cleanly, or one rolling back) released and handed back to the reuse session's pool;
        an actor that does not answer (a lost host's) is killed."""
        if self.runtime.autoscale:  # the nodes may go idle now, and be removed
            self.placement.release_room()
        actors = {id(h): (name, h) for name, h in self.hosts.items()}
        if self._graph is not None:
            actors.setdefault(id(self._graph), ("graph", self._graph))
        # Before the actors go: their spilled state is on local disk. Only actors that came
        # up: a call to one never placed would wait for it forever.
        close_hosts(self, [name for name in self.members.client_hosts() if name in self.placed])
        if keep and self.pooling:
            self._hand_back(list(actors.values()))
        else:
            for _, handle in actors.values():
                self._ray.kill(handle)

    def _hand_back(self, actors: list[tuple[str, object]]) -> None:
        """Release each actor's host (its memory freed) and put the actor in the pool; one
        that does not answer is killed instead."""
        releases = [(name, handle, handle.release.remote()) for name, handle in actors]
        for name, handle, ref in releases:
            try:
                self._ray.get(ref, timeout=self.runtime.placement_timeout_s)
            except Exception as error:  # dead or stuck: never handed to another federation
                log.info("actor of host %s not kept: %s", name, one_line(error))
                self._ray.kill(handle)
                continue
            kind = GRAPH_KIND if handle is self._graph else self.kinds[name]
            POOL.give_back(handle, kind, name)


def actor_has_a_worker(handle) -> bool:
    """Whether Ray has placed the actor: a worker process is given to it (starting, or
    running), as Ray's actor table says; False where the table cannot be read."""
    from ray._private.state import actors

    try:
        info = actors(actor_id=handle._actor_id.hex())
    except Exception:  # the table is Ray's internal API: never a reason to fail a run
        return False
    address = (info or {}).get("Address") or {}
    return (info or {}).get("State") == "ALIVE" or bool(address.get("Port"))


def one_line(error: BaseException) -> str:
    """An error's text on one line (Ray's span several)."""
    return " ".join(str(error).split())


def creation_error(error) -> str:
    """What an actor's creation task raised (its traceback's last line), from the
    RayActorError that reports it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
