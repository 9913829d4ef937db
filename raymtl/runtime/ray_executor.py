"""The RayExecutor: hosts as Ray actors with fractional resources; payloads stay in the
object store. A lost host raises `HostsLost` (the federation rolls back), or is dropped for
good while enough clients answer (runtime.min_clients_fraction). An error raised while an
actor is built is a `ConfigError` naming the host: replaying would only raise it again."""

from __future__ import annotations

import logging
import math
import uuid

from raymtl.algorithms.base import role_of
from raymtl.config import RuntimeConfig
from raymtl.runtime.executor import REHOSTABLE_ROLES, Executor, HostsLost, build_error
from raymtl.runtime.results import Answer

log = logging.getLogger(__name__)


def auto_clients_per_actor(num_clients: int, cpus: float, cpus_per_actor: float) -> int:
    """Pool clients so the client actors fill the cluster's CPUs once."""
    actors = max(1, int(cpus // cpus_per_actor))
    return max(1, math.ceil(num_clients / actors))


class RayExecutor(Executor):
    """Hosts are Ray actors with fractional resources; payloads stay in the object store."""

    def __init__(self, runtime: RuntimeConfig):
        super().__init__(runtime)
        import ray

        from raymtl.runtime.actors import GraphActor

        self._ray = ray
        # Named actors (raymtl-<run tag>-<host>) show up readably in the dashboard and
        # `ray list actors`; the tag keeps concurrent runs on one cluster apart.
        self.tag = uuid.uuid4().hex[:8]
        self.graph = GraphActor.options(name=f"raymtl-{self.tag}-graph").remote()
        self.rehosted: dict[str, int] = {}  # host name -> replacements so far

    def clients_per_actor(self, num_clients: int) -> int:
        limit = self.runtime.clients_per_actor
        if limit != "auto":
            return limit
        cpus = self._ray.cluster_resources().get("CPU", 1.0)
        return auto_clients_per_actor(num_clients, cpus, self.runtime.num_cpus_per_actor)

    def peer_mixing(self, kind, num_nodes, seed, params):
        return self._ray.get(self.graph.peer_mixing.remote(kind, num_nodes, seed, params))

    def share_pools(self, pools: dict) -> dict:
        """Each pool into the object store once: the actors of a node map one copy."""
        from raymtl.runtime.host_data import pool_to_shared

        return {name: self._ray.put(pool_to_shared(pool)) for name, pool in pools.items()}

    def memory_available(self) -> int:
        """The memory Ray reports for the cluster's tasks and actors."""
        return int(self._ray.cluster_resources().get("memory", 0)) or super().memory_available()

    def _start_host(self, name, role, spec):
        from raymtl.runtime.actors import ACTOR_OF_ROLE

        if role == "graph":  # the graph service also hosts the algorithm's graph steps
            try:
                self._ray.get(self.graph.attach.remote(spec))
            except self._ray.exceptions.RayTaskError as error:  # the spec did not unpickle
                raise build_error(name, error.cause or error) from error
            return self.graph
        if role == "client":
            resources = {
                "num_cpus": self.runtime.num_cpus_per_actor,
                "num_gpus": self.runtime.num_gpus_per_actor,
                "scheduling_strategy": "SPREAD",
            }
        else:  # coordinators are light: they must not take a CPU slot from the clients
            resources = {"num_cpus": 0}
        actor_cls = ACTOR_OF_ROLE[role]
        # No Ray restarts: an actor restarted alone would reload an older checkpoint than its
        # peers hold. A lost host rolls the whole federation back instead (driver.py).
        return actor_cls.options(
            name=f"raymtl-{self.tag}-{name}", max_restarts=0, max_task_retries=0, **resources
        ).remote(spec)

    def _build(self, names):
        """Build every named actor in parallel. An exception raised by `build`, or by the
        actor's creation (its spec could not be unpickled there), is the configuration's or
        the node's: one ConfigError line. An actor that died otherwise is a lost host."""
        refs = {name: self.hosts[name].build.remote() for name in names}
        failed, detail = [], ""
        for name, ref in refs.items():
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayTaskError as error:
                raise build_error(name, error.cause or error) from error
            except self._ray.exceptions.RayActorError as error:
                if error.actor_init_failed:
                    raise build_error(name, creation_error(error)) from error
                failed.append(name)
                detail = detail or " ".join(str(error).split())[:200]
        if failed:
            nodes = {name: self.nodes.get(name, "?") for name in failed}
            raise HostsLost("build", failed, nodes, detail)

    def _call(self, method, calls):
        refs = {
            name: getattr(self.hosts[name], method).remote(*args) for name, args in calls.items()
        }
        results, failed, detail = {}, [], ""
        for name, ref in refs.items():
            try:
                results[name] = self._ray.get(ref)
            except self._ray.exceptions.ObjectLostError as error:
                # The host is alive but a payload it was handed died with its sender's host
                # (e.g. a task leader lost between its two steps): nothing to go on with, so
                # the federation rolls back.
                detail = " ".join(str(error).split())[:200]
                raise HostsLost(method, [name], {name: self.nodes.get(name, "?")}, detail) from None
            except self._ray.exceptions.RayActorError as error:
                log.warning("host %s failed during %s: %s", name, method, error)
                if role_of(self.members[name][0]) in REHOSTABLE_ROLES:
                    results[name] = self._rehost(name, method, calls[name])
                else:
                    failed.append(name)
                    detail = detail or " ".join(str(error).split())[:200]
        return Answer(results, self._check_quorum(method, calls, failed, detail))

    def _rehost(self, name: str, method: str, args: tuple):
        """Start a new host for a lost one whose roles can move (a task leader) and repeat
        the call there; the algorithm's `rehost` decides who takes the role over."""
        self.rehosted[name] = self.rehosted.get(name, 0) + 1
        spec = self.specs[name]
        role = role_of(spec.participants[0])
        handle = self._start_host(f"{name}-r{self.rehosted[name]}", role, spec)
        self.hosts[name] = handle
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

    def start(self, specs):
        super().start(specs)
        # Where each actor runs (faults.parquet names the node of a lost host).
        self.nodes = self._call("node", {name: () for name in self.hosts}).value

    def shutdown(self):
        self._close_hosts()  # before the actors go: their spilled state is on local disk
        for handle in {id(h): h for h in [*self.hosts.values(), self.graph]}.values():
            self._ray.kill(handle)
        self._forget_hosts()


def creation_error(error) -> str:
    """What an actor's creation task raised (its traceback's last line), from the
    RayActorError that reports it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__
