"""A peer graph's mixing weights, computed where the executor keeps its graph service."""

from __future__ import annotations


def peer_mixing(executor, kind: str, num_nodes: int, seed: int, params: dict) -> dict:
    """The peer graph's Metropolis weights ({i: {j: w_ij}}, graph/mixing.py), on the
    executor's graph service (the Ray executor's graph actor: networkx, igraph and leidenalg
    stay out of the training processes); in this process when it has none (the inline
    executor, or no executor: the pre-flight check). The same weights either way."""
    service = None if executor is None else executor.graph_service
    if service is None:
        from raymtl.graph.mixing import mixing_from_topology

        return mixing_from_topology(kind, num_nodes, seed, params)
    import ray

    return ray.get(service.peer_mixing.remote(kind, num_nodes, seed, params))
