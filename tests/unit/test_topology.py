"""Unit tests for raymtl.graph.topology: builders, validation and Metropolis weights."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from raymtl.graph import (
    TOPOLOGIES,
    build_topology,
    metropolis_weights,
    neighbours,
    register_topology,
)

NUM_NODES = 12
CUSTOM_RING = [[node, (node + 1) % NUM_NODES] for node in range(NUM_NODES)]
KIND_PARAMS = {"custom": {"edges": CUSTOM_RING}}


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
def test_every_kind_is_connected_and_deterministic(kind: str) -> None:
    params = KIND_PARAMS.get(kind, {})
    graph = build_topology(kind, NUM_NODES, seed=3, **params)
    again = build_topology(kind, NUM_NODES, seed=3, **params)
    assert sorted(graph.nodes) == list(range(NUM_NODES))
    assert nx.is_connected(graph)
    assert nx.number_of_selfloops(graph) == 0
    assert sorted(graph.edges) == sorted(again.edges)


@pytest.mark.parametrize("kind", ["erdos_renyi", "watts_strogatz", "barabasi_albert"])
def test_random_kinds_depend_on_seed(kind: str) -> None:
    edge_sets = {frozenset(build_topology(kind, 30, seed=seed).edges) for seed in range(5)}
    assert len(edge_sets) > 1


@pytest.mark.parametrize("seed", range(5))
def test_erdos_renyi_is_connected_even_for_tiny_p(seed: int) -> None:
    graph = build_topology("erdos_renyi", 40, seed=seed, p=1e-6)
    assert nx.is_connected(graph)
    # Nearly no random edges: the chain of components adds exactly n - 1 edges.
    assert graph.number_of_edges() == 39


def test_single_node_complete_graph() -> None:
    graph = build_topology("complete", 1, seed=0)
    assert list(graph.nodes) == [0]
    assert metropolis_weights(graph).tolist() == [[1.0]]


def test_registry_lists_descriptions_and_params() -> None:
    assert TOPOLOGIES["erdos_renyi"].params == {"p": 0.15}
    assert TOPOLOGIES["watts_strogatz"].params == {"k": 4, "p": 0.1}
    assert TOPOLOGIES["barabasi_albert"].params == {"m": 2}
    assert TOPOLOGIES["ring"].params == {}
    assert all(spec.description for spec in TOPOLOGIES.values())


@pytest.mark.parametrize(
    ("kind", "num_nodes", "params", "message"),
    [
        (
            "custom",
            4,
            {"edges": [[0, 1], [2, 3]]},
            r"topology\.params\.edges: the graph is not connected",
        ),
        (
            "custom",
            3,
            {"edges": [[0, 1], [1, 5]]},
            r"topology\.params\.edges: \[1, 5\] has a node id",
        ),
        (
            "custom",
            3,
            {"edges": [[0, 1], [1, 1]]},
            r"topology\.params\.edges: \[1, 1\] is a self loop",
        ),
        ("custom", 3, {}, r"topology\.params\.edges: required"),
        ("erdos_renyi", 5, {"p": 1.5}, r"topology\.params\.p: 1\.5 is not in \(0, 1\]"),
        ("erdos_renyi", 5, {"p": 0.0}, r"topology\.params\.p: 0\.0 is not in \(0, 1\]"),
        ("watts_strogatz", 5, {"k": 6}, r"topology\.params\.k: 6 is not an even integer"),
        ("watts_strogatz", 10, {"k": 3}, r"topology\.params\.k: 3 is not an even integer"),
        ("barabasi_albert", 3, {"m": 3}, r"topology\.params\.m: 3 is not an integer in \[1, "),
        ("ring", 5, {"p": 0.5}, r"topology\.params\.p: not a parameter of ring"),
        ("star", 5, {}, r"topology\.kind: 'star' is not one of"),
        ("complete", 0, {}, r"topology\.num_nodes: 0 is not a positive integer"),
    ],
)
def test_bad_input_raises_one_line_value_error(kind, num_nodes, params, message) -> None:
    with pytest.raises(ValueError, match=message) as error:
        build_topology(kind, num_nodes, seed=0, **params)
    assert "\n" not in str(error.value)


def test_disconnected_custom_lists_components() -> None:
    with pytest.raises(ValueError, match=r"components: \[\[0, 1\], \[2, 3\], \[4\]\]"):
        build_topology("custom", 5, seed=0, edges=[[0, 1], [2, 3]])


def test_metropolis_weights_on_path_graph_match_hand_computation() -> None:
    path = nx.Graph([(0, 1), (1, 2)])
    expected = np.array([[2 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 3, 2 / 3]])
    np.testing.assert_allclose(metropolis_weights(path), expected)


@pytest.mark.parametrize("kind", ["erdos_renyi", "watts_strogatz", "barabasi_albert", "ring"])
def test_metropolis_weights_are_symmetric_doubly_stochastic(kind: str) -> None:
    weights = metropolis_weights(build_topology(kind, 20, seed=1))
    np.testing.assert_allclose(weights.sum(axis=0), 1.0)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)
    np.testing.assert_allclose(weights, weights.T)
    assert (weights >= 0).all()


def test_neighbours_are_sorted_adjacency_lists() -> None:
    graph = build_topology("ring", 4, seed=0)
    assert neighbours(graph) == {0: [1, 3], 1: [0, 2], 2: [1, 3], 3: [0, 2]}


@pytest.fixture
def registered_topologies():
    before = dict(TOPOLOGIES)
    yield
    TOPOLOGIES.clear()
    TOPOLOGIES.update(before)


def test_a_registered_graph_is_checked_when_built(registered_topologies):
    @register_topology("halves", params={"gap": True})
    def halves(num_nodes: int, seed: int, *, gap: bool = True) -> nx.Graph:
        """Two complete halves, joined unless there is a gap."""
        graph = nx.disjoint_union(
            nx.complete_graph(num_nodes // 2), nx.complete_graph(num_nodes - num_nodes // 2)
        )
        if not gap:
            graph.add_edge(0, num_nodes - 1)
        return graph

    assert TOPOLOGIES["halves"].params == {"gap": True}
    assert TOPOLOGIES["halves"].description == "Two complete halves, joined unless there is a gap."
    assert nx.is_connected(build_topology("halves", 8, 0, gap=False))
    with pytest.raises(ValueError, match=r"^topology.kind: halves gave a graph of 2 components"):
        build_topology("halves", 8, 0)


@pytest.mark.parametrize(
    ("name", "build", "problem"),
    [
        ("star", lambda n, seed: nx.star_graph(n - 1), "'star' is a built-in shape"),
        ("two", lambda n: nx.path_graph(n), "must take (num_nodes, seed, *, params)"),
        ("ring", lambda n, seed: nx.path_graph(n), "topology.kind: 'ring' is registered twice"),
        ("bad name", lambda n, seed: nx.path_graph(n), "is not a name"),
    ],
)
def test_a_builder_that_breaks_the_contract_is_refused(registered_topologies, name, build, problem):
    with pytest.raises(ValueError) as error:
        register_topology(name, description="a test graph")(build)
    assert problem in str(error.value) and "\n" not in str(error.value)
