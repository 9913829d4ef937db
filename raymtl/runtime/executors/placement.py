"""Where an executor's hosts go: how many client actors fit where, the one line that says
what a layout lacks, and each executor's `Placement`.

Room is a mapping of places (Ray nodes, or the bundles of a Tune trial's placement group) to
their resources. An actor never spans two places, so room is counted place by place, by CPUs
and by GPUs: six actors of a quarter GPU need two GPUs' worth of room, however many CPUs the
node has. The functions are pure arithmetic; a `Placement` (the executor's `placement`)
decides with them: `Placement` in process, `RayPlacement` on the nodes Ray reports.

Nodes (Ray): a placement knows the nodes that were alive when the run started. Once one of
them is dead, the client actors are laid out on the nodes alive now: an explicit
clients_per_actor whose actors no longer fit is raised (`replanned` says so in one line);
results do not depend on the layout. runtime.autoscale asks the autoscaler for the client
actors' bundles first (`request_room`).
"""

from __future__ import annotations

import logging
import math
import os
import time

from raymtl.algorithms.base import client_name
from raymtl.config import ConfigError, RuntimeConfig
from raymtl.runtime.faults import RunStopped

log = logging.getLogger(__name__)


def actors_that_fit(room: dict[str, dict[str, float]], cpus: float, gpus: float) -> int:
    """How many actors of `cpus` CPUs and `gpus` GPUs the places of `room` hold."""
    total = 0
    for resources in room.values():
        # The small epsilon keeps 0.3 + 0.3 + 0.3 of 0.9 CPUs at three actors.
        fits = int(resources.get("CPU", 0.0) / cpus + 1e-9)
        if gpus > 0:
            fits = min(fits, int(resources.get("GPU", 0.0) / gpus + 1e-9))
        total += fits
    return total


def auto_clients_per_actor(num_clients: int, capacity: int) -> int:
    """`clients_per_actor: auto`: the client actors fill the room once, ⌈N / capacity⌉
    clients each (at least one client an actor)."""
    return max(1, math.ceil(num_clients / max(1, capacity)))


def clients_per_actor_here(num_clients: int, runtime: RuntimeConfig) -> int:
    """`clients_per_actor: auto` as a local Ray on this machine lays the actors out."""
    import torch

    here = {"CPU": runtime.num_cpus or os.cpu_count() or 1, "GPU": torch.cuda.device_count()}
    room = actors_that_fit({"here": here}, runtime.num_cpus_per_actor, runtime.num_gpus_per_actor)
    return auto_clients_per_actor(num_clients, room)


def client_blocks(num_clients: int, per_host: int) -> dict[str, list[str]]:
    """Client host name -> its clients, pinned in contiguous blocks of `per_host`."""
    return {
        f"clients-{k}": [client_name(i) for i in range(start, min(start + per_host, num_clients))]
        for k, start in enumerate(range(0, num_clients, per_host))
    }


def fitted_clients_per_actor(num_clients: int, wanted: int, capacity: int) -> int:
    """`wanted` clients an actor when their actors fit `capacity` actors, else the fewest
    clients an actor that do (capacity >= 1)."""
    if math.ceil(num_clients / wanted) <= capacity:
        return wanted
    return math.ceil(num_clients / capacity)


def amount(value: float, unit: str) -> str:
    """'1 CPU', '2 CPUs', '0.5 GPU', '0 GPUs'."""
    return f"{value:g} {unit}" + ("" if value == 1 or 0 < value < 1 else "s")


def actor_needs(cpus: float, gpus: float) -> str:
    """What one client actor asks Ray for: '1 CPU', '1 CPU and 0.5 GPU'."""
    needs = amount(cpus, "CPU")
    if gpus:
        needs += f" and {amount(gpus, 'GPU')}"
    return needs


def nodes_have(room: dict[str, dict[str, float]], gpus: bool) -> str:
    """What the places hold in all: '2 CPUs', '2 CPUs and 1 GPU'."""
    have = amount(sum(r.get("CPU", 0.0) for r in room.values()), "CPU")
    if gpus:
        have += f" and {amount(sum(r.get('GPU', 0.0) for r in room.values()), 'GPU')}"
    return have


def missing(room: dict[str, dict[str, float]], actors: int, cpus: float, gpus: float) -> str:
    """What `actors` actors lack on `room`: the resources whose total falls short ('0.5 GPU
    missing'), or, when the totals suffice, that they do not fit place by place."""
    short = []
    for unit, each in (("CPU", cpus), ("GPU", gpus)):
        lacking = actors * each - sum(r.get(unit, 0.0) for r in room.values())
        if each and lacking > 1e-9:
            short.append(amount(round(lacking, 6), unit))
    if short:
        return " and ".join(short) + " missing"
    return "enough in all, but not on any one node for each actor"


def layout_refusal(
    room: dict[str, dict[str, float]],
    where: str,
    num_clients: int,
    clients_per_actor: int | str,
    cpus: float,
    gpus: float,
) -> str | None:
    """None when the client actors of this layout fit `room`; else the one line that says
    what is missing and what would fit. `where` names the room ("this machine's Ray", "the
    cluster", "the trial's placement group")."""
    capacity = actors_that_fit(room, cpus, gpus)
    if clients_per_actor == "auto":
        per_actor = auto_clients_per_actor(num_clients, capacity)
    else:
        per_actor = int(clients_per_actor)
    actors = math.ceil(num_clients / per_actor)
    if capacity and actors <= capacity:
        return None
    needs = actor_needs(cpus, gpus)
    have = f"{where} has {nodes_have(room, gpus > 0)}"
    if not capacity:
        lacking = missing(room, 1, cpus, gpus)
        if gpus and not sum(r.get("GPU", 0.0) for r in room.values()):
            hint = "runtime.num_gpus_per_actor: 0 to train on CPUs"
        else:
            hint = "a smaller runtime.num_cpus_per_actor or num_gpus_per_actor"
        return f"runtime: not one client actor of {needs} fits: {have} ({lacking}); give {hint}"
    fits = fitted_clients_per_actor(num_clients, per_actor, capacity)
    return (
        f"runtime.clients_per_actor: {clients_per_actor} makes {actors} client actors of "
        f"{needs} for {num_clients} clients; {have}, room for {capacity} "
        f"({missing(room, actors, cpus, gpus)}); give clients_per_actor: {fits} or auto, or "
        "ask less of each actor (runtime.num_cpus_per_actor, num_gpus_per_actor)"
    )


def actor_needs_of(runtime: RuntimeConfig) -> str:
    """What one client actor of `runtime` asks Ray for: '1 CPU and 0.5 GPU'."""
    return actor_needs(runtime.num_cpus_per_actor, runtime.num_gpus_per_actor)


class Placement:
    """Where the hosts of an executor run, in process: every host in the driver's process,
    the client hosts of runtime.clients_per_actor clients each (`auto`: one host for all).
    No node is ever lost, so nothing is re-planned and no node is waited for."""

    def __init__(self, runtime: RuntimeConfig):
        self.runtime = runtime
        # Why the client actors hold more clients than runtime.clients_per_actor says (a
        # node was lost and they no longer fit), in one line, and the nodes lost.
        self.replanned: str | None = None
        self.replanned_nodes: list[str] = []

    def clients_per_actor(self, num_clients: int) -> int:
        """Clients a client host holds."""
        limit = self.runtime.clients_per_actor
        return num_clients if limit == "auto" else limit

    def share_pools(self, pools: dict) -> dict | None:
        """Make the decoded pools available to every host (None: each host loads its own)."""
        return None

    def settle_nodes(self, nodes, timeout: float) -> list[str]:
        """Wait until each node of `nodes` (where lost hosts ran) is declared dead or is seen
        alive, at most `timeout` seconds; the dead ones (in process: no nodes)."""
        return []

    def rows(self, executor) -> dict[str, dict]:
        """Where each of `executor`'s hosts runs (hosts.parquet): its node and actor, the
        CPUs and GPUs its actor asked for, the device its clients train on. In process: the
        driver's."""
        return {
            name: {
                "node": "driver",
                "actor": "",
                "num_cpus": float("nan"),
                "num_gpus": 0.0,
                "device": spec.device,
            }
            for name, spec in executor.specs.items()
        }


class RayPlacement(Placement):
    """Where the hosts of a RayExecutor run: client actors laid out by CPUs and GPUs, node
    by node (in a Tune trial: its placement group's bundles), on the nodes alive now."""

    def __init__(self, runtime: RuntimeConfig, ray, nodes_at_start: dict | None = None):
        super().__init__(runtime)
        self._ray = ray
        # The nodes alive when the run started (launch.py): one of them dead now is a lost
        # node, and the client actors are laid out on what is left.
        self.nodes_at_start = alive_nodes(ray) if nodes_at_start is None else nodes_at_start

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
        address = self.runtime.address
        where = "the cluster" if address is not None else "this machine's Ray"
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

    def share_pools(self, pools: dict) -> dict:
        """Each pool into the object store once: the actors of a node map one copy."""
        from raymtl.runtime.hosts.host_data import pool_to_shared

        return {name: self._ray.put(pool_to_shared(pool)) for name, pool in pools.items()}

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

    def request_room(self, actors: int) -> None:
        """runtime.autoscale: ask the autoscaler for room for `actors` client actors (a
        bundle of num_cpus_per_actor CPUs and num_gpus_per_actor GPUs each; coordinators
        take none) and wait until the nodes alive hold them, at most
        runtime.placement_timeout_s; then stop the run in one line. The request stands
        until `release_room` (the executor shuts down), so the nodes stay while the
        federation needs them."""
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

    def release_room(self) -> None:
        """runtime.autoscale: withdraw the request, so that idle nodes may be removed."""
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[])

    def rows(self, executor) -> dict[str, dict]:
        """Where each of `executor`'s hosts runs: its node and actor, the CPUs and GPUs its
        actor asked for, and the device its clients train on (hosts.parquet)."""
        return {
            name: {
                "node": executor.nodes.get(name, "?"),
                # The actor's id: the same across seeds and experiments whose hosts reused it
                "actor": handle._actor_id.hex(),
                "num_cpus": executor.kinds[name].num_cpus,
                "num_gpus": executor.kinds[name].num_gpus,
                "device": executor.specs[name].device,
            }
            for name, handle in executor.hosts.items()
        }


def alive_nodes(ray) -> dict[str, dict[str, float]]:
    """Node id -> its resources, for every node Ray reports alive."""
    return {node["NodeID"]: dict(node["Resources"]) for node in ray.nodes() if node["Alive"]}


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
