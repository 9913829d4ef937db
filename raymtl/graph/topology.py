"""Communication graphs between clients, and their Metropolis-Hastings mixing weights.

Every builder is seeded, returns a connected simple graph on nodes 0..n-1, and is listed in
``TOPOLOGIES`` with a one-line description and its parameters (name -> default). A plugin
adds one the same way:

    @register_topology("grid")
    def grid(num_nodes: int, seed: int, *, width: int = 4) -> nx.Graph:
        '''One line for `raymtl list`.'''

The keyword-only parameters are `topology.params`; `build_topology` refuses a graph that is
not connected on 0..n-1. The kinds without a peer graph (``STRUCTURED_KINDS``: star,
hierarchical, none, groups) are shapes the runtime builds, and no graph may take their names.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raymtl.registry import NAME, Registry

if TYPE_CHECKING:  # imported where a graph is built: hosts that only train never load it
    import networkx as nx


@dataclass(frozen=True)
class TopologySpec:
    """A registered graph builder: ``spec(num_nodes, seed, **params) -> nx.Graph``."""

    build: Callable[..., nx.Graph]
    description: str
    params: dict[str, object]

    def __call__(self, num_nodes: int, seed: int, **params: object) -> nx.Graph:
        return self.build(num_nodes, seed, **params)


TOPOLOGIES: Registry[TopologySpec] = Registry("topology.kind", lambda spec: spec.build)
# Topology kinds that are no peer graph: the shapes the runtime builds itself.
STRUCTURED_KINDS = ("star", "hierarchical", "none", "groups")


def register_topology(
    name: str, description: str | None = None, params: dict[str, object] | None = None
) -> Callable[[Callable[..., nx.Graph]], Callable[..., nx.Graph]]:
    """Decorator: register the graph builder `fn(num_nodes, seed, *, params) -> nx.Graph`.

    `description` defaults to the first line of its docstring and `params` (name ->
    default) to its keyword-only arguments. Raises a one-line ValueError for a builder that
    breaks the contract (see the module docstring) or a taken name.

    Args:
        name: the kind, as `topology.kind` gives it; not one of `STRUCTURED_KINDS`.
        description: the line `raymtl list` shows; None: the first line of the docstring.
        params: the parameters `topology.params` may set, name -> default (each a
            keyword-only argument of the builder); None: all of its keyword-only arguments.

    Returns:
        The decorator: it registers the builder and returns it unchanged.

    Raises:
        ValueError: one line, from the decorator, for a bad or built-in name, a builder not
            taking (num_nodes, seed, *, params), unknown `params`, no description, or a
            name another builder holds.
    """

    def decorator(build: Callable[..., nx.Graph]) -> Callable[..., nx.Graph]:
        TOPOLOGIES.add(name, topology_spec(name, build, description, params))
        return build

    return decorator


def topology_spec(name, build, description, params) -> TopologySpec:
    """The spec of `build` as kind `name`, checked against the contract."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"register_topology: {name!r} is not a name (letters, digits, _ . -)")
    where = f"register_topology('{name}')"
    if name in STRUCTURED_KINDS:
        raise ValueError(f"{where}: '{name}' is a built-in shape, not a peer graph name")
    if not callable(build):
        raise ValueError(f"{where}: {build!r} is not a function fn(num_nodes, seed, *, params)")
    refusal = TOPOLOGIES.clash(name, TopologySpec(build, "", {}))
    if refusal is not None:
        raise ValueError(refusal)
    parameters = inspect.signature(build).parameters.values()
    positional = [p.name for p in parameters if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    if len(positional) != 2:
        raise ValueError(f"{where}: {build.__qualname__} must take (num_nodes, seed, *, params)")
    keyword = {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    params = keyword if params is None else dict(params)
    if not set(params) <= set(keyword):
        unknown = ", ".join(sorted(set(params) - set(keyword)))
        raise ValueError(f"{where}: params {unknown} are not keyword-only arguments of the builder")
    text = description or (inspect.getdoc(build) or "").strip()
    if not text:
        raise ValueError(f"{where}: give a description (or a docstring) for `raymtl list`")
    return TopologySpec(build, text.splitlines()[0], params)


def build_topology(kind: str, num_nodes: int, seed: int, **params: object) -> nx.Graph:
    """The connected graph `kind` on nodes 0..num_nodes-1 (one-line ValueError on bad input)."""
    if kind not in TOPOLOGIES:
        raise ValueError(TOPOLOGIES.unknown(kind))
    spec = TOPOLOGIES[kind]
    for param in params:
        if param not in spec.params:
            allowed = ", ".join(spec.params) or "none"
            raise ValueError(
                f"topology.params.{param}: not a parameter of {kind} (allowed: {allowed})"
            )
    if not _is_int(num_nodes) or num_nodes < 1:
        raise ValueError(f"topology.num_nodes: {num_nodes!r} is not a positive integer")
    if not _is_int(seed):
        raise ValueError(f"seed: {seed!r} is not an integer")
    return _check_graph(kind, spec(num_nodes, seed, **params), num_nodes)


def _check_graph(kind: str, graph: object, num_nodes: int) -> nx.Graph:
    """A builder's graph is a connected simple graph on 0..num_nodes-1."""
    import networkx as nx

    if not isinstance(graph, nx.Graph) or graph.is_directed() or graph.is_multigraph():
        raise ValueError(f"topology.kind: {kind} returned {type(graph).__name__}, not nx.Graph")
    if sorted(graph.nodes) != list(range(num_nodes)):
        raise ValueError(f"topology.kind: {kind} must give a graph on nodes 0..{num_nodes - 1}")
    if not nx.is_connected(graph):
        components = nx.number_connected_components(graph)
        raise ValueError(f"topology.kind: {kind} gave a graph of {components} components")
    return graph


@register_topology("complete")
def complete_topology(num_nodes: int, seed: int) -> nx.Graph:
    """Every pair of clients is connected (a single client is allowed)."""
    import networkx as nx

    return nx.complete_graph(num_nodes)


@register_topology("ring")
def ring_topology(num_nodes: int, seed: int) -> nx.Graph:
    """Cycle 0-1-...-(n-1)-0 (a path for fewer than 3 clients)."""
    import networkx as nx

    # nx.cycle_graph would add a self loop for n=1 and cannot double the edge for n=2.
    return nx.cycle_graph(num_nodes) if num_nodes >= 3 else nx.path_graph(num_nodes)


@register_topology("erdos_renyi")
def erdos_renyi_topology(num_nodes: int, seed: int, *, p: float = 0.15) -> nx.Graph:
    """G(n, p) random graph, connected by one random edge between consecutive components."""
    import networkx as nx

    _check_probability("topology.params.p", p, allow_zero=False)
    graph = nx.gnp_random_graph(num_nodes, p, seed=seed)
    connect_components(graph, np.random.default_rng(seed))
    return graph


@register_topology("watts_strogatz")
def watts_strogatz_topology(num_nodes: int, seed: int, *, k: int = 4, p: float = 0.1) -> nx.Graph:
    """Connected small world: ring lattice of k neighbours, each edge rewired with prob. p."""
    import networkx as nx

    if not _is_int(k) or k < 2 or k % 2 or k >= num_nodes:
        raise ValueError(
            f"topology.params.k: {k!r} is not an even integer in "
            f"[2, num_nodes - 1 = {num_nodes - 1}]"
        )
    _check_probability("topology.params.p", p, allow_zero=True)
    try:
        return nx.connected_watts_strogatz_graph(num_nodes, k, p, tries=100, seed=seed)
    except nx.NetworkXError as error:
        raise ValueError(f"topology.params.p: {p} gave no connected graph in 100 tries") from error


@register_topology("barabasi_albert")
def barabasi_albert_topology(num_nodes: int, seed: int, *, m: int = 2) -> nx.Graph:
    """Preferential attachment: each new client links to m existing ones."""
    import networkx as nx

    if not _is_int(m) or not 1 <= m < num_nodes:
        raise ValueError(
            f"topology.params.m: {m!r} is not an integer in [1, num_nodes - 1 = {num_nodes - 1}]"
        )
    return nx.barabasi_albert_graph(num_nodes, m, seed=seed)


@register_topology("custom")
def custom_topology(num_nodes: int, seed: int, *, edges: list[list[int]] | None = None) -> nx.Graph:
    """User-given undirected edges [[i, j], ...]; must connect all clients."""
    import networkx as nx

    if edges is None:
        raise ValueError("topology.params.edges: required for kind custom (a list of [i, j] pairs)")
    graph = nx.empty_graph(num_nodes)
    for edge in edges:
        graph.add_edge(*_check_edge(edge, num_nodes))
    if not nx.is_connected(graph):
        components = sorted(sorted(component) for component in nx.connected_components(graph))
        raise ValueError(
            f"topology.params.edges: the graph is not connected (components: {components})"
        )
    return graph


def connect_components(graph: nx.Graph, rng: np.random.Generator) -> None:
    """Chain the connected components (ordered by smallest node) with one random edge each."""
    import networkx as nx

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
        raise ValueError(f"topology.params.edges: {edge!r} is not a pair [i, j] of node ids")
    first, second = edge
    if not (0 <= first < num_nodes and 0 <= second < num_nodes):
        raise ValueError(
            f"topology.params.edges: {list(edge)} has a node id outside 0..{num_nodes - 1}"
        )
    if first == second:
        raise ValueError(f"topology.params.edges: {list(edge)} is a self loop")
    return first, second


def _check_probability(field: str, value: object, allow_zero: bool) -> None:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    low_ok = is_number and (value >= 0 if allow_zero else value > 0)
    if not (is_number and math.isfinite(value) and low_ok and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{field}: {value!r} is not in {interval}")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)
