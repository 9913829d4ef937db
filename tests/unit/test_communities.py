"""Community detection: Louvain and Leiden, edge cases, canonical labels, modularity."""

from __future__ import annotations

import numpy as np
import pytest

from raymtl.graph.communities import canonical_labels, detect_communities, modularity


def two_triangles() -> np.ndarray:
    w = np.zeros((6, 6))
    for a, b in ((0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5)):
        w[a, b] = w[b, a] = 1.0
    w[2, 3] = w[3, 2] = 0.05  # weak bridge
    return w


@pytest.mark.parametrize("method", ["louvain", "leiden"])
def test_two_dense_groups_are_found(method):
    assert detect_communities(two_triangles(), method, seed=0) == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("method", ["louvain", "leiden"])
def test_a_node_without_positive_edges_is_its_own_community(method):
    w = np.zeros((7, 7))
    w[:6, :6] = two_triangles()
    w[6, 0] = w[0, 6] = -0.3  # negative weights are not edges
    labels = detect_communities(w, method, seed=1)
    assert labels[:6] == [0, 0, 0, 1, 1, 1] and labels[6] == 2


@pytest.mark.parametrize("method", ["louvain", "leiden"])
def test_no_edges_gives_singletons(method):
    assert detect_communities(np.zeros((3, 3)), method) == [0, 1, 2]
    assert detect_communities(np.zeros((1, 1)), method) == [0]
    assert detect_communities(np.zeros((0, 0)), method) == []


@pytest.mark.parametrize("method", ["louvain", "leiden"])
def test_seeded_detection_is_reproducible(method):
    rng = np.random.default_rng(0)
    upper = np.triu(rng.uniform(size=(30, 30)), k=1)
    w = upper + upper.T
    assert detect_communities(w, method, seed=5) == detect_communities(w, method, seed=5)


def test_labels_are_numbered_by_smallest_member():
    assert canonical_labels([{4, 2}, {0, 3}, {1}], 5) == [0, 1, 2, 0, 2]


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="community"):
        detect_communities(two_triangles(), "girvan")


def test_modularity_of_two_separate_edges_is_one_half():
    w = np.zeros((4, 4))
    w[0, 1] = w[1, 0] = w[2, 3] = w[3, 2] = 1.0
    assert modularity(w, [0, 0, 1, 1]) == pytest.approx(0.5)
    assert modularity(w, [0, 0, 0, 0]) == pytest.approx(0.0)
    assert modularity(np.zeros((2, 2)), [0, 1]) == 0.0
