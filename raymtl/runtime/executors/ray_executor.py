"""The RayExecutor: hosts as Ray actors with fractional resources; payloads stay in the
object store. A lost host raises `HostsLost` (the federation rolls back), or is dropped for
good while enough clients answer (runtime.min_clients_fraction). An error raised while an
actor is built is a `ConfigError` naming the host: replaying would only raise it again.

Nodes: an executor knows the nodes that were alive when the run started. Once one of them
is dead, the client actors are laid out on the nodes alive now: an explicit
clients_per_actor whose actors no longer fit is raised (`replanned` says so in one line);
results do not depend on the layout. Actors Ray cannot place within
runtime.placement_timeout_s stop the run in one line (`RunStopped`), never a silent hang.

Actors are reused: inside a reuse session (actor_pool.py: the seeds of a run, the
experiments of a sequential compare) an executor takes idle actors of the kind it needs and
`attach`es them to its specs, and one shut down after a clean federation or for a rollback
(`keep`) hands back the actors that still answer instead of killing them: a replay starts
new actors only for the hosts it lost.

runtime.autoscale asks the autoscaler for the client actors' bundles first
(`request_room`); `torch_sees_gpu` tells the planner whether a GPU share is one torch can
use (else `device: auto` trains on CPU); `kill_host` is runtime.inject_faults' kill.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import Counter

from raymtl.algorithms.base import role_of
from raymtl.config import ConfigError, RuntimeConfig
from raymtl.errors import StepFailed
from raymtl.runtime.actors.classes import GRAPH_KIND, start_actor
from raymtl.runtime.actors.pool import POOL, ActorKind
from raymtl.runtime.executors.executor import REHOSTABLE_ROLES, Executor, HostsLost, build_error
from raymtl.runtime.executors.placement import (
    actor_needs,
    actors_that_fit,
    auto_clients_per_actor,
    fitted_clients_per_actor,
    layout_refusal,
    nodes_have,
)
from raymtl.runtime.faults import RunStopped
from raymtl.runtime.results import Answer

log = logging.getLogger(__name__)


def alive_nodes(ray) -> dict[str, dict[str, float]]:
    """Node id -> its resources, for every node Ray reports alive."""
    return {node["NodeID"]: dict(node["Resources"]) for node in ray.nodes() if node["Alive"]}


def actor_needs_of(runtime: RuntimeConfig) -> str:
    """What one client actor of `runtime` asks Ray for: '1 CPU and 0.5 GPU'."""
    return actor_needs(runtime.num_cpus_per_actor, runtime.num_gpus_per_actor)


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
        # The nodes alive when the run started (launch.py): one of them dead now is a lost
        # node, and the client actors are laid out on what is left.
        self.nodes_at_start = alive_nodes(ray) if nodes_at_start is None else nodes_at_start
        # Named actors (raymtl-<run tag>-<host>) show up readably in the dashboard and
        # `ray list actors`; the tag keeps concurrent runs on one cluster apart.
        self.tag = uuid.uuid4().hex[:8]
        self._placement_s = 0.0  # the wait for the actors to come up (`_build`)
        self._graph = None  # the graph service's actor, started when first asked for
        self.rehosted: dict[str, int] = {}  # host name -> replacements so far
        self.placed: set[str] = set()  # hosts whose actors Ray has started
        # What each host's actor asked Ray for (hosts.parquet's num_cpus, num_gpus).
        self.resources: dict[str, dict[str, float]] = {}
        self.layout_hosts: frozenset[str] = frozenset()  # the hosts `start` was given

    def clients_per_actor(self, num_clients: int) -> int:
        """Clients an actor. `auto` fills the room once, by CPUs and GPUs, node by node (in a
        Tune trial: its placement group's bundles). After a node was lost, the client actors
        are laid out on the nodes left (`_fit`). Otherwise a layout whose client actors do
        not fit the room is one line: at once where the room cannot grow (a local Ray, a
        trial's bundles: their size is known), after runtime.placement_timeout_s where it
        may (a cluster joined at runtime.address, where nodes may still join). Under
        runtime.autoscale the autoscaler is asked for the room instead (`request_room`)."""
        runtime = self.runtime
        if runtime.autoscale:
            return runtime.clients_per_actor
        gone = self.nodes_lost()
        cpus, gpus = runtime.num_cpus_per_actor, runtime.num_gpus_per_actor
        may_grow = runtime.address is not None and trial_group_strategy() is None
        deadline = time.monotonic() + runtime.placement_timeout_s
        while True:
            room, where = self.room()
            capacity = actors_that_fit(room, cpus, gpus)
            wanted = runtime.clients_per_actor
            if wanted == "auto" and capacity:
                wanted = auto_clients_per_actor(num_clients, capacity)
            if gone:
                return self._fit(num_clients, wanted if wanted != "auto" else 1, gone)
            refusal = layout_refusal(room, where, num_clients, wanted, cpus, gpus)
            if refusal is None:
                return wanted
            if not may_grow:
                raise ConfigError(refusal)
            if time.monotonic() >= deadline:
                timeout = runtime.placement_timeout_s
                raise RunStopped(f"{refusal}; waited {timeout:g} s (runtime.placement_timeout_s)")
            time.sleep(1.0)

    def room(self) -> tuple[dict[str, dict[str, float]], str]:
        """Where client actors may go, and its name for a line: the bundles of the Tune
        trial this runs in (compare --parallel, tune), or every node alive."""
        bundles = trial_group_bundles()
        if bundles is not None:
            return bundles, "the trial's placement group"
        where = "the cluster" if self.runtime.address is not None else "this machine's Ray"
        return alive_nodes(self._ray), where

    def nodes_lost(self) -> list[str]:
        """The nodes alive when the run started that Ray has declared dead since."""
        return sorted(set(self.nodes_at_start) - set(alive_nodes(self._ray)))

    def _fit(self, num_clients: int, wanted: int, gone: list[str]) -> int:
        """Clients per actor such that the client actors fit the nodes alive now (`wanted`
        when they do). When not even one actor fits, resources may still come (a node
        replaced): wait up to runtime.placement_timeout_s, then stop the run in one line."""
        runtime = self.runtime
        cpus, gpus = runtime.num_cpus_per_actor, runtime.num_gpus_per_actor
        after = f"alive after node {', '.join(gone)} was lost"
        deadline = time.monotonic() + runtime.placement_timeout_s
        while True:
            alive = alive_nodes(self._ray)
            capacity = actors_that_fit(alive, cpus, gpus)
            if capacity:
                break
            if time.monotonic() >= deadline:
                raise RunStopped(
                    f"runtime: not one client actor of {actor_needs_of(runtime)} fits the "
                    f"{nodes_have(alive, gpus > 0)} {after}; waited "
                    f"{runtime.placement_timeout_s:g} s (runtime.placement_timeout_s)"
                )
            time.sleep(1.0)
        fitted = fitted_clients_per_actor(num_clients, wanted, capacity)
        if fitted != wanted:
            was = f"auto ({wanted})" if runtime.clients_per_actor == "auto" else wanted
            self.replanned = (
                f"runtime.clients_per_actor: {was} -> {fitted}: "
                f"{math.ceil(num_clients / wanted)} client actors of {actor_needs_of(runtime)} "
                f"do not fit the {nodes_have(alive, gpus > 0)} {after}; "
                f"{math.ceil(num_clients / fitted)} actors of up to {fitted} clients do"
            )
            self.replanned_nodes = gone
        return fitted

    def settle_nodes(self, nodes, timeout: float) -> list[str]:
        """Wait until Ray has declared each of `nodes` dead, or the node has answered (a
        host killed on a live node), at most `timeout` seconds; the dead ones. Until Ray
        declares a lost node dead it may place new actors there, to be lost with it: a
        second recovery for one lost node."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        waiting = {node for node in nodes if node and node != "?"}
        if not waiting:
            return []
        probe = ray.remote(num_cpus=0, max_retries=0)(lambda: True)
        answers = {
            probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(): node
            for node in waiting
        }
        dead, deadline = [], time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            alive = alive_nodes(ray)
            dead += sorted(waiting - set(alive))
            waiting &= set(alive)
            pending = [ref for ref, node in answers.items() if node in waiting]
            if not pending:  # every probe failed: Ray is about to declare the node dead
                time.sleep(0.5)
                continue
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            for ref in ready:
                node = answers.pop(ref)
                try:
                    ray.get(ref)
                    waiting.discard(node)  # it answered: alive
                except ray.exceptions.RayError:
                    pass  # not schedulable there: wait for Ray to declare the node dead
        if waiting:
            log.warning(
                "node %s neither answered nor was declared dead by Ray within %g s",
                ", ".join(sorted(waiting)),
                timeout,
            )
        return dead

    @property
    def graph(self):
        """The graph service's actor: peer topologies and the algorithm's graph steps. Started
        (or taken from the reuse session) on first use: a federation without a peer graph or
        a graph participant never starts its process."""
        if self._graph is None:
            self._graph = self.pooling and POOL.take(GRAPH_KIND, "graph")
            if not self._graph:
                self._graph = start_actor(GRAPH_KIND, f"raymtl-{self.tag}-graph")
        return self._graph

    def peer_mixing(self, kind, num_nodes, seed, params):
        return self._ray.get(self.graph.peer_mixing.remote(kind, num_nodes, seed, params))

    def share_pools(self, pools: dict) -> dict:
        """Each pool into the object store once: the actors of a node map one copy."""
        from raymtl.runtime.hosts.host_data import pool_to_shared

        return {name: self._ray.put(pool_to_shared(pool)) for name, pool in pools.items()}

    def memory_available(self) -> int:
        """The memory Ray reports for the cluster's tasks and actors."""
        return int(self._ray.cluster_resources().get("memory", 0)) or super().memory_available()

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
            self._attaching[name] = self.graph.attach.remote(spec)
            return self.graph
        self.resources[name] = {"num_cpus": kind.num_cpus, "num_gpus": kind.num_gpus}
        reused = self.pooling and POOL.take(kind, name, self.layout_hosts)
        if reused:  # an actor of the last federation: given this one's spec
            self._attaching[name] = reused.attach.remote(spec)
            return reused
        placement = {}
        if role == "client":
            placement["scheduling_strategy"] = trial_group_strategy() or "SPREAD"
        return start_actor(kind, f"raymtl-{self.tag}-{name}", spec, **placement)

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

    def hosts_up_seconds(self, started: float) -> float:
        """The actors' creation, then the wait until every one answered (`_build`)."""
        return started + self._placement_s

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
        alive, gone = alive_nodes(self._ray), self.nodes_lost()
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
        self.settle_nodes([self.nodes.get(name, "?")], self.runtime.placement_timeout_s)
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
            self.request_room(clients)
        seconds = super().start(specs)
        # Where each actor runs (faults.parquet names the node of a lost host).
        self.nodes = self._call("node", {name: () for name in self.hosts}).value
        return seconds

    def request_room(self, actors: int) -> None:
        """runtime.autoscale: ask the autoscaler for room for `actors` client actors (a
        bundle of num_cpus_per_actor CPUs and num_gpus_per_actor GPUs each; coordinators
        take none) and wait until the nodes alive hold them, at most
        runtime.placement_timeout_s; then stop the run in one line. The request stands
        until the executor shuts down, so the nodes stay while the federation needs them."""
        from ray.autoscaler.sdk import request_resources

        runtime = self.runtime
        cpus, gpus = runtime.num_cpus_per_actor, runtime.num_gpus_per_actor
        bundle = {"CPU": cpus} | ({"GPU": gpus} if gpus else {})
        request_resources(bundles=[bundle] * actors)
        deadline = time.monotonic() + runtime.placement_timeout_s
        alive = alive_nodes(self._ray)
        while actors_that_fit(alive, cpus, gpus) < actors:
            if time.monotonic() >= deadline:
                request_resources(bundles=[])
                raise RunStopped(
                    f"runtime.autoscale: the autoscaler did not bring up room for {actors} "
                    f"client actors of {actor_needs_of(runtime)} within "
                    f"runtime.placement_timeout_s: {runtime.placement_timeout_s:g} s; the "
                    f"{len(alive)} nodes alive have {nodes_have(alive, gpus > 0)}"
                )
            time.sleep(1.0)
            alive = alive_nodes(self._ray)
        log.info("autoscale: %d nodes alive hold the %d client actors", len(alive), actors)

    def torch_sees_gpu(self) -> bool | None:
        """Whether torch sees a GPU in a task given a client actor's GPU share (Ray sets its
        CUDA_VISIBLE_DEVICES as it does the actor's); None when no such task was placed
        within runtime.placement_timeout_s (then the actors' placement says why)."""
        seen = self._gpu_probe()
        return None if seen is None else seen[0]

    def gpu_memory(self) -> int | None:
        """Bytes of memory of the GPU a task given a client actor's share sees (None: none,
        or no such task was placed)."""
        seen = self._gpu_probe()
        return None if seen is None or not seen[0] else seen[1]

    def _gpu_probe(self) -> tuple[bool, int] | None:
        """What a task given a client actor's GPU share sees: asked once per share and Ray
        session (`GPU_PROBES`). Idle actors of the reuse session that hold GPUs and are of
        another kind go first: they would hold the room the probe needs, and this layout
        cannot use them."""
        ray, share = self._ray, self.runtime.num_gpus_per_actor
        key = (ray.get_runtime_context().get_job_id(), share)
        if key not in GPU_PROBES:
            client_kind = self.actor_kind("client")
            keep = Counter(
                idle.kind
                for idle in POOL.idle
                if not idle.kind.num_gpus or idle.kind == client_kind
            )
            POOL.keep_only(keep, ray.kill)
            probe = ray.remote(num_cpus=0, num_gpus=share)
            where = trial_group_strategy() or "DEFAULT"  # a Tune trial's GPUs are its group's
            task = probe(gpu_seen_by_torch).options(max_retries=0, scheduling_strategy=where)
            answer = task.remote()
            ready, _ = ray.wait([answer], timeout=self.runtime.placement_timeout_s)
            if not ready:
                ray.cancel(answer, force=True)
                return None
            GPU_PROBES[key] = tuple(ray.get(answer))
        return GPU_PROBES[key]

    def kill_host(self, name: str) -> None:
        """runtime.inject_faults: kill host `name`'s actor (no restart), as a crashed
        process would be, and wait until Ray reports it dead, so the fault falls in the
        round it was meant for. The federation's recovery handles it like a real fault."""
        handle = self.hosts[name]
        self.injected.add(name)
        self._ray.kill(handle, no_restart=True)
        deadline = time.monotonic() + self.runtime.placement_timeout_s
        while time.monotonic() < deadline:
            try:
                self._ray.get(handle.ping.remote(), timeout=5.0)
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
                return
            time.sleep(0.1)

    def drop(self, name: str, method: str, detail: str) -> dict:
        row = super().drop(name, method, detail)
        row["injected"] = name in self.injected
        return row

    def layout(self) -> dict[str, dict]:
        """Where each host runs: its node and actor, the CPUs and GPUs its actor asked for,
        and the device its clients train on (hosts.parquet)."""
        return {
            name: {
                "node": self.nodes.get(name, "?"),
                # The actor's id: the same across seeds and experiments whose hosts reused it
                "actor": self.hosts[name]._actor_id.hex(),
                "num_cpus": self.resources.get(name, {}).get("num_cpus", 0.0),
                "num_gpus": self.resources.get(name, {}).get("num_gpus", 0.0),
                "device": self.specs[name].device,
            }
            for name in self.hosts
        }

    def shutdown(self, keep: bool = False):
        """Stop the hosts: their actors are killed, or with `keep` (a federation that ended
        cleanly, or one rolling back) released and handed back to the reuse session's pool;
        an actor that does not answer (a lost host's) is killed."""
        if self.runtime.autoscale:  # the nodes may go idle now, and be removed
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[])
        # Before the actors go: their spilled state is on local disk. Only actors that came
        # up: a call to one never placed would wait for it forever.
        self._close_hosts([name for name in self.client_hosts() if name in self.placed])
        actors = {id(h): (name, h) for name, h in self.hosts.items()}
        if self._graph is not None:
            actors.setdefault(id(self._graph), ("graph", self._graph))
        if keep and self.pooling:
            self._hand_back(list(actors.values()))
        else:
            for _, handle in actors.values():
                self._ray.kill(handle)
        self._forget_hosts()

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


# (Ray job, GPU share) -> what a task given that share saw: (torch sees a GPU, its bytes).
GPU_PROBES: dict[tuple, tuple[bool, int]] = {}


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


def gpu_seen_by_torch() -> tuple[bool, int]:
    """Run inside a task holding a GPU share: whether torch sees a GPU there, and its
    memory in bytes (0 without one)."""
    import torch

    if not torch.cuda.is_available():
        return False, 0
    return True, torch.cuda.get_device_properties(0).total_memory


def trial_group_strategy():
    """Inside a Tune trial's placement group (compare --parallel, tune): a strategy that
    keeps a client actor in one of its bundles (SPREAD would place it outside the group,
    on room another trial holds); None outside one."""
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = get_current_placement_group()
    if group is None:
        return None
    return PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)


def trial_group_bundles() -> dict[str, dict[str, float]] | None:
    """The client bundles of the current placement group (a Tune trial's), as places an
    actor may take; None outside one. Its first bundle, empty, is the trial's driver."""
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is None:
        return None
    return {f"bundle-{k}": dict(bundle) for k, bundle in enumerate(group.bundle_specs)}


def one_line(error: BaseException) -> str:
    """An error's text on one line (Ray's span several)."""
    return " ".join(str(error).split())


def creation_error(error) -> str:
    """What an actor's creation task raised (its traceback's last line), from the
    RayActorError that reports it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
