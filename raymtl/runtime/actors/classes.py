"""The Ray actors: hosts of clients, the server, LPSs, task leaders and the graph service.

Client, server and LPS actors are `ParticipantHost`s whose payloads go through
Ray's object store: `put` is called in the sending actor and `get` in the
receiving one, so tensors move actor to actor and never through the driver.
An actor's constructor keeps its spec only; the executor then calls `build`, so an error
while building (a plugin, the data) comes back as that error, not as a dead actor. An actor
kept for the next federation of the driver (runtime/actors/pool.py) is handed that federation's spec
by `attach`, which drops everything of the host it was before.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import ray
import torch

from raymtl.flops import warm_up_counting
from raymtl.runtime.actors.pool import ActorKind
from raymtl.runtime.hosts.host import ParticipantHost
from raymtl.runtime.hosts.memory import reset_peak_rss, return_freed_memory


def as_array(tensor: torch.Tensor):
    """A message tensor as a numpy array (bfloat16, which numpy lacks, stays a tensor)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.detach().cpu()
    return tensor.detach().cpu().numpy()


def as_tensor(value) -> torch.Tensor:
    return torch.from_numpy(np.array(value)) if isinstance(value, np.ndarray) else value


class ObjectStoreHost(ParticipantHost):
    """A ParticipantHost whose message payloads and data pools live in Ray's object store."""

    def __init__(self, spec=None):
        # No spec: the graph service, started before its federation exists; `attach` gives
        # it one (and a kept actor its next federation's).
        if spec is not None:
            self._shared_pools = {}
            super().__init__(spec)

    def attach(self, spec) -> bool:
        """Serve a new federation: forget the host this actor was (`release`), keep `spec`."""
        self.release()
        ObjectStoreHost.__init__(self, spec)
        return True

    def release(self) -> bool:
        """Drop every attribute of the host this actor was (participants, states, data,
        models), free their memory, and start the peak memory over: the next federation
        sees a host as fresh as a new actor's."""
        for name in list(vars(self)):
            if not name.startswith("_ray"):  # anything Ray keeps on the instance stays
                delattr(self, name)
        gc.collect()
        return_freed_memory()
        reset_peak_rss()
        return True

    def warm_start(self) -> float:
        """For an actor `raymtl up` keeps warm (warm/service.py): pay now what a fresh actor pays in
        its first federation, the imports of its build, the optimiser's first step
        (torch._dynamo) and FLOP counting's; seconds taken. The actor is left as it was (no
        host attached)."""
        began = time.perf_counter()
        import raymtl.algorithms.registry  # noqa: F401  (every built-in algorithm)
        import raymtl.data.client_data  # noqa: F401
        import raymtl.models.registry  # noqa: F401
        import raymtl.runtime.hosts.host_data  # noqa: F401

        model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten())
        model(torch.zeros(2, 1, 5, 5)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.0).step()
        warm_up_counting()
        gc.collect()
        return time.perf_counter() - began

    def put(self, tensors):
        # As numpy arrays: Ray writes them straight into the object store, where torch tensors
        # are pickled first (several times slower for a model's weights).
        return ray.put({name: as_array(t) for name, t in tensors.items()})

    def get(self, payloads):
        # A writable copy of each array: a step may never write into the object store.
        fetched = ray.get(payloads) if payloads else []
        return [{name: as_tensor(a) for name, a in payload.items()} for payload in fetched]

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def serving(self) -> str:
        """The name of the host this actor serves now ("" while it is idle). An actor kept
        for the next federation keeps the name Ray gave it when it started (raymtl-<run
        tag>-<host>), which may be another run's and another host's."""
        spec = getattr(self, "spec", None)
        return spec.name if spec is not None else ""

    def pool(self, source: str):
        """The pool the driver put in the object store: one copy per node, mapped here."""
        refs = self.spec.pools or {}
        if source not in refs:
            return super().pool(source)
        from raymtl.runtime.hosts.host_data import pool_from_shared

        if source not in self._shared_pools:
            self._shared_pools[source] = pool_from_shared(ray.get(refs[source]))
        return self._shared_pools[source]


@ray.remote
class ClientActor(ObjectStoreHost):
    """Hosts one or more pinned clients: data, model and algorithm state stay here."""


@ray.remote
class ServerActor(ObjectStoreHost):
    """The server of star algorithms and the GPS of hierarchical FL."""


@ray.remote
class LPSActor(ObjectStoreHost):
    """A local parameter server of hierarchical FL."""


@ray.remote(num_cpus=0)
class GraphActor(ObjectStoreHost):
    """CPU-only graph service: networkx/igraph/leidenalg stay out of training processes.

    It builds topologies before the federation exists, then (`attach`, and `build` like
    every host) hosts the algorithm's "graph" participant: similarity graphs, communities,
    clustering.
    """

    def __init__(self):  # the federation (and so the HostSpec) does not exist yet
        pass

    def warm_start(self) -> float:
        began = time.perf_counter()
        import raymtl.graph.communities  # noqa: F401
        import raymtl.graph.mixing  # noqa: F401

        return time.perf_counter() - began + super().warm_start()

    def peer_mixing(self, kind: str, num_nodes: int, seed: int, params: dict) -> dict:
        from raymtl.graph.mixing import mixing_from_topology

        return mixing_from_topology(kind, num_nodes, seed, params)


@ray.remote
class LeaderActor(ObjectStoreHost):
    """A task leader (ColNet): the cross-group duty of whichever client of the group holds
    it this round. Light: started with no CPU slot."""


ACTOR_OF_ROLE = {
    "client": ClientActor,
    "server": ServerActor,
    "lps": LPSActor,
    "leader": LeaderActor,
}


GRAPH_KIND = ActorKind("graph", 0.0, 0.0)


def start_actor(kind: ActorKind, name: str, spec=None, **options):
    """A host actor of `kind` named `name` (`options`: more of Ray's, e.g. its scheduling
    strategy or namespace): clients with their CPUs and GPUs, coordinators with none, the
    graph service with no spec (it is `attach`ed one). Used by the executor and by
    `raymtl up`'s pool (warm/service.py), whose actors have no spec until a run attaches one."""
    if kind.role == "graph":
        return GraphActor.options(name=name, **options).remote()
    resources = {"num_cpus": kind.num_cpus}
    if kind.role == "client":
        resources["num_gpus"] = kind.num_gpus
    args = () if spec is None else (spec,)
    # No Ray restarts: an actor restarted alone would reload an older checkpoint than its
    # peers hold. A lost host rolls the whole federation back instead (driver.py).
    return (
        ACTOR_OF_ROLE[kind.role]
        .options(name=name, max_restarts=0, max_task_retries=0, **resources, **options)
        .remote(*args)
    )
