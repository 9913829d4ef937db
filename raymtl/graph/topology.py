"""Communication graphs between clients, and their Metropolis-Hastings mixing weights.

Every builder is seeded, returns a connected simple graph on nodes 0..n-1, and is listed in
``TOPOLOGIES`` with a one-line description and its parameters (name -> default).
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
import numpy as np


@dataclass(frozen=True)
class TopologySpec:
    """A registered graph builder: ``spec(num_nodes, seed, **params) -> nx.Graph``."""

    build: Callable[..., nx.Graph]
    description: str
    params: dict[str, object]

    def __call__(self, num_nodes: int, seed: int, **params: object) -> nx.Graph:
        return self.build(num_nodes, seed, **params)


TOPOLOGIES: dict[str, TopologySpec] = {}


def _register(kind: str) -> Callable[[Callable[..., nx.Graph]], Callable[..., nx.Graph]]:
    # Description = first docstring line; parameters = keyword-only arguments with defaults.
    def decorator(build: Callable[..., nx.Graph]) -> Callable[..., nx.Graph]:
        params = {
            name: parameter.default
            for name, parameter in inspect.signature(build).parameters.items()
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        }
        description = (inspect.getdoc(build) or "").splitlines()[0]
        TOPOLOGIES[kind] = TopologySpec(build, description, params)
        return build

    return decorator


def build_topology(kind: str, num_nodes: int, seed: int, **params: object) -> nx.Graph:
    """The connected graph `kind` on nodes 0..num_nodes-1 (one-line ValueError on bad input)."""
    if kind not in TOPOLOGIES:
        raise ValueError(f"topology.kind: '{kind}' is not one of {', '.join(TOPOLOGIES)}")
    spec = TOPOLOGIES[kind]
    for param in params:
        if param not in spec.params:
            allowed = ", ".join(spec.params) or "none"
            raise ValueError(f"topology.{param}: not a parameter of {kind} (allowed: {allowed})")
    if not _is_int(num_nodes) or num_nodes < 1:
        raise ValueError(f"topology.num_nodes: {num_nodes!r} is not a positive integer")
    if not _is_int(seed):
        raise ValueError(f"seed: {seed!r} is not an integer")
    return spec(num_nodes, seed, **params)


@_register("complete")
def complete_topology(num_nodes: int, seed: int) -> nx.Graph:
    """Every pair of clients is connected (a single client is allowed)."""
    return nx.complete_graph(num_nodes)


@_register("ring")
def ring_topology(num_nodes: int, seed: int) -> nx.Graph:
    """Cycle 0-1-...-(n-1)-0 (a path for fewer than 3 clients)."""
    # nx.cycle_graph would add a self loop for n=1 and cannot double the edge for n=2.
    return nx.cycle_graph(num_nodes) if num_nodes >= 3 else nx.path_graph(num_nodes)


@_register("erdos_renyi")
def erdos_renyi_topology(num_nodes: int, seed: int, *, p: float = 0.15) -> nx.Graph:
    """G(n, p) random graph, connected by one random edge between consecutive components."""
    _check_probability("topology.p", p, allow_zero=False)
    graph = nx.gnp_random_graph(num_nodes, p, seed=seed)
    connect_components(graph, np.random.default_rng(seed))
    return graph


@_register("watts_strogatz")
def watts_strogatz_topology(num_nodes: int, seed: int, *, k: int = 4, p: float = 0.1) -> nx.Graph:
    """Connected small world: ring lattice of k neighbours, each edge rewired with prob. p."""
    if not _is_int(k) or k < 2 or k % 2 or k >= num_nodes:
        raise ValueError(
            f"topology.k: {k!r} is not an even integer in [2, num_nodes - 1 = {num_nodes - 1}]"
        )
    _check_probability("topology.p", p, allow_zero=True)
    try:
        return nx.connected_watts_strogatz_graph(num_nodes, k, p, tries=100, seed=seed)
    except nx.NetworkXError as error:
        raise ValueError(f"topology.p: {p} gave no connected graph in 100 tries") from error


@_register("barabasi_albert")
def barabasi_albert_topology(num_nodes: int, seed: int, *, m: int = 2) -> nx.Graph:
    """Preferential attachment: each new client links to m existing ones."""
    if not _is_int(m) or not 1 <= m < num_nodes:
        raise ValueError(
            f"topology.m: {m!r} is not an integer in [1, num_nodes - 1 = {num_nodes - 1}]"
        )
    return nx.barabasi_albert_graph(num_nodes, m, seed=seed)


@_register("custom")
def custom_topology(num_nodes: int, seed: int, *, edges: list[list[int]] | None = None) -> nx.Graph:
    """User-given undirected edges [[i, j], ...]; must connect all clients."""
    if edges is None:
        raise ValueError("topology.edges: required for kind custom (a list of [i, j] pairs)")
    graph = nx.empty_graph(num_nodes)
    for edge in edges:
        graph.add_edge(*_check_edge(edge, num_nodes))
    if not nx.is_connected(graph):
        components = sorted(sorted(component) for component in nx.connected_components(graph))
        raise ValueError(f"topology.edges: the graph is not connected (components: {components})")
    return graph


def connect_components(graph: nx.Graph, rng: np.random.Generator) -> None:
    """Chain the connected components (ordered by smallest node) with one random edge each."""
    components = sorted(sorted(component) for component in nx.connected_components(graph))
    for left, right in itertools.pairwise(components):
        graph.add_edge(int(rng.choice(left)), int(rng.choice(right)))


def metropolis_weights(graph: nx.Graph) -> np.ndarray:
    """(n, n) symmetric doubly stochastic Metropolis-Hastings mixing matrix.

    w_ij = 1 / (1 + max(deg_i, deg_j)) on edges, w_ii = 1 - sum_j w_ij, 0 elsewhere.
    """
    neighbour_lists = neighbours(graph)
    num_nodes = len(neighbour_lists)
    weights = np.zeros((num_nodes, num_nodes))
    for node, adjacent in neighbour_lists.items():
        for other in adjacent:
            degree = max(len(adjacent), len(neighbour_lists[other]))
            weights[node, other] = 1.0 / (1.0 + degree)
    weights[np.diag_indices(num_nodes)] = 1.0 - weights.sum(axis=1)
    return weights


def neighbours(graph: nx.Graph) -> dict[int, list[int]]:
    """Sorted neighbours of every node (self loops ignored); nodes must be 0..n-1."""
    if sorted(graph.nodes) != list(range(graph.number_of_nodes())):
        raise ValueError("graph: nodes must be the integers 0..n-1")
    return {
        node: sorted(other for other in graph.neighbors(node) if other != node)
        for node in range(graph.number_of_nodes())
    }


def _check_edge(edge: object, num_nodes: int) -> tuple[int, int]:
    if not isinstance(edge, list | tuple) or len(edge) != 2 or not all(map(_is_int, edge)):
        raise ValueError(f"topology.edges: {edge!r} is not a pair [i, j] of node ids")
    first, second = edge
    if not (0 <= first < num_nodes and 0 <= second < num_nodes):
        raise ValueError(f"topology.edges: {list(edge)} has a node id outside 0..{num_nodes - 1}")
    if first == second:
        raise ValueError(f"topology.edges: {list(edge)} is a self loop")
    return first, second


def _check_probability(field: str, value: object, allow_zero: bool) -> None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    low_ok = is_number and (value >= 0 if allow_zero else value > 0)
    if not (is_number and math.isfinite(value) and low_ok and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{field}: {value!r} is not in {interval}")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)
