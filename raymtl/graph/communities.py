"""Community detection on a weighted similarity graph: Louvain (networkx) or Leiden (leidenalg).

Blondel et al., "Fast unfolding of communities in large networks", J. Stat. Mech. 2008
(Louvain); Traag et al., "From Louvain to Leiden", Sci. Rep. 2019 (Leiden).

Both maximise the weighted modularity
    Q = (1/2m) Σ_ij [w_ij − γ·k_i·k_j/(2m)] · δ(c_i, c_j),   k_i = Σ_j w_ij, 2m = Σ_ij w_ij,
with resolution γ (1 = the paper's modularity). Only positive weights are edges; a node with
no positive edge is its own community, and a graph without any edge is all singletons.
Labels are canonical: communities are numbered by their smallest member, so equal partitions
get equal labels whatever the backend returned.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Method = Literal["louvain", "leiden"]
METHODS: tuple[str, ...] = ("louvain", "leiden")


def canonical_labels(groups: list[set[int]], n: int) -> list[int]:
    """Community label per node 0..n-1, communities numbered by their smallest member."""
    labels = [-1] * n
    for label, members in enumerate(sorted((sorted(g) for g in groups if g), key=min)):
        for node in members:
            labels[node] = label
    next_label = max(labels, default=-1) + 1
    for node in range(n):  # nodes a backend left out: singletons
        if labels[node] < 0:
            labels[node], next_label = next_label, next_label + 1
    return canonical_from_labels(labels)


def canonical_from_labels(labels: list[int]) -> list[int]:
    """Renumber labels in order of first appearance (= smallest member first)."""
    mapping: dict[int, int] = {}
    return [mapping.setdefault(label, len(mapping)) for label in labels]


def edges_of(weights: np.ndarray) -> list[tuple[int, int, float]]:
    """(i, j, w) for i < j with w > 0."""
    rows, cols = np.nonzero(np.triu(np.asarray(weights, dtype=float), k=1) > 0)
    return [(int(i), int(j), float(weights[i, j])) for i, j in zip(rows, cols, strict=True)]


def louvain(weights: np.ndarray, seed: int, resolution: float = 1.0) -> list[int]:
    """Louvain modularity maximisation (networkx, seeded)."""
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(len(weights)))
    graph.add_weighted_edges_from(edges_of(weights))
    groups = nx.community.louvain_communities(
        graph, weight="weight", resolution=resolution, seed=seed % (2**32)
    )
    return canonical_labels([set(g) for g in groups], len(weights))


def leiden(weights: np.ndarray, seed: int, resolution: float = 1.0) -> list[int]:
    """Leiden modularity maximisation (leidenalg on igraph, seeded)."""
    import igraph as ig
    import leidenalg

    edges = edges_of(weights)
    graph = ig.Graph(n=len(weights), edges=[(i, j) for i, j, _ in edges])
    graph.es["weight"] = [w for _, _, w in edges]
    partition = leidenalg.find_partition(
        graph,
        leidenalg.RBConfigurationVertexPartition,
        weights="weight",
        resolution_parameter=resolution,
        seed=seed % (2**31),
    )
    return canonical_from_labels(list(partition.membership))


def detect_communities(
    weights: np.ndarray, method: Method = "louvain", seed: int = 0, resolution: float = 1.0
) -> list[int]:
    """Community label per node of the symmetric weight matrix (diagonal ignored)."""
    weights = np.asarray(weights, dtype=float)
    n = len(weights)
    if n == 0:
        return []
    if not edges_of(weights):
        return list(range(n))  # no positive edge at all: every node alone
    if method == "louvain":
        return louvain(weights, seed, resolution)
    if method == "leiden":
        return leiden(weights, seed, resolution)
    raise ValueError(f"community: '{method}' is not one of {', '.join(METHODS)}")


def modularity(weights: np.ndarray, labels: list[int], resolution: float = 1.0) -> float:
    """Weighted modularity Q of a partition (0 for a graph without edges)."""
    w = np.clip(np.asarray(weights, dtype=float), 0, None)
    np.fill_diagonal(w, 0.0)
    total = w.sum()
    if total <= 0:
        return 0.0
    degree = w.sum(axis=1)
    same = np.equal.outer(np.asarray(labels), np.asarray(labels))
    return float(((w - resolution * np.outer(degree, degree) / total) * same).sum() / total)
