"""Peer-graph mixing weights as the algorithms consume them."""

from __future__ import annotations

from raymtl.graph.topology import build_topology, metropolis_weights


def mixing_from_topology(kind: str, num_nodes: int, seed: int, params: dict) -> dict:
    """The graph's Metropolis weights as {i: {j: w_ij}} over i itself and its neighbours."""
    graph = build_topology(kind, num_nodes, seed, **params)
    weights = metropolis_weights(graph)
    return {
        i: {j: float(weights[i, j]) for j in range(num_nodes) if j == i or graph.has_edge(i, j)}
        for i in range(num_nodes)
    }
