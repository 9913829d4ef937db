"""Data-similarity clustering of users: relevance from shared eigenvectors, then HAC.

Ali & Arafa, "Data Similarity-Based One-Shot Clustering for Multi-Task Hierarchical
Federated Learning" (docs/ALGORITHMS.md, One-shot HFL), after Amiri et al.'s data relevance.

User i, features Φ_i = Φ(X_i) ∈ R^{n_i×d}:
    Σ_i = Φ_iᵀ Φ_i / n_i,   (λ^{(i)}, V_i) = its top-k eigenpairs (λ descending)
From user j's shared eigenvectors v_k^{(j)} (k = 1..K):
    λ̂_k = ‖Σ_i v_k^{(j)}‖
    r(i, j) = Π_k (min(λ_k^{(i)}, λ̂_k) / max(λ_k^{(i)}, λ̂_k))^{1/K}
Server:
    R(i, j) = (r(i, j) + r(j, i)) / 2
    clusters = HAC(1 − R, linkage) cut into T clusters
Baseline: random clusters with the same sizes (a seeded permutation of the labels).
Pure numpy/scipy: no torch, no Ray.
"""

from __future__ import annotations

import numpy as np

LINKAGES = ("average", "complete", "single", "weighted")


def gram_matrix(features: np.ndarray) -> np.ndarray:
    """Σ = ΦᵀΦ / n of an (n, d) feature matrix, in float64."""
    phi = np.asarray(features, dtype=np.float64)
    if phi.ndim != 2 or phi.shape[0] == 0:
        raise ValueError(f"features: expected a non-empty (n, d) matrix, got {phi.shape}")
    return phi.T @ phi / phi.shape[0]


def top_eigenpairs(gram: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest eigenvalues (descending, (k,)) and their eigenvectors as columns (d, k)."""
    if not 1 <= k <= gram.shape[0]:
        raise ValueError(f"num_eigen: {k} is not in [1, {gram.shape[0]}] (the feature dimension)")
    values, vectors = np.linalg.eigh(gram)  # ascending
    order = np.arange(gram.shape[0] - 1, gram.shape[0] - 1 - k, -1)
    return np.clip(values[order], 0.0, None), vectors[:, order]


def projected_eigenvalues(gram: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """λ̂_k = ‖Σ v_k‖ for every column v_k of `vectors` (d, k)."""
    return np.linalg.norm(gram @ np.asarray(vectors, dtype=np.float64), axis=0)


def relevance(eigenvalues: np.ndarray, projected: np.ndarray) -> float:
    """r = Π_k (min(λ_k, λ̂_k) / max(λ_k, λ̂_k))^{1/K}; 0/0 counts as a perfect match."""
    own, other = np.asarray(eigenvalues, float), np.asarray(projected, float)
    high, low = np.maximum(own, other), np.minimum(own, other)
    ratios = np.divide(low, high, out=np.ones_like(high), where=high > 0)
    return float(np.prod(ratios ** (1.0 / ratios.size)))


def relevance_row(gram: np.ndarray, eigenvalues: np.ndarray, others: dict) -> dict[int, float]:
    """r(i, j) for every user j of `others` ({j: eigenvectors (d, k)})."""
    return {
        j: relevance(eigenvalues, projected_eigenvalues(gram, vectors))
        for j, vectors in others.items()
    }


def symmetric_relevance(r: np.ndarray) -> np.ndarray:
    """R = (r + rᵀ) / 2 of an (N, N) matrix of r(i, j) (row i: user i's estimates)."""
    r = np.asarray(r, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] != r.shape[1]:
        raise ValueError(f"relevance: expected a square matrix, got {r.shape}")
    return (r + r.T) / 2


def hac_linkage(similarity: np.ndarray, linkage: str = "average") -> np.ndarray:
    """The scipy linkage matrix Z of HAC on the distances 1 − R."""
    from scipy.cluster.hierarchy import linkage as scipy_linkage
    from scipy.spatial.distance import squareform

    if linkage not in LINKAGES:
        raise ValueError(f"linkage: {linkage!r} is not one of {', '.join(LINKAGES)}")
    distance = np.clip(1.0 - np.asarray(similarity, dtype=np.float64), 0.0, None)
    distance = (distance + distance.T) / 2
    np.fill_diagonal(distance, 0.0)
    return scipy_linkage(squareform(distance, checks=False), method=linkage)


def canonical_labels(labels) -> np.ndarray:
    """Relabel clusters 0..T-1 in order of their smallest member (a stable naming)."""
    labels = np.asarray(labels)
    order = {}
    for label in labels.tolist():
        order.setdefault(label, len(order))
    return np.array([order[label] for label in labels.tolist()], dtype=np.int64)


def hac_clusters(similarity: np.ndarray, num_clusters: int, linkage: str = "average"):
    """Cut the HAC dendrogram of 1 − R into exactly `num_clusters` clusters.

    Returns (labels (N,) in 0..T-1 named by smallest member, linkage matrix Z).
    """
    from scipy.cluster.hierarchy import cut_tree

    n = np.asarray(similarity).shape[0]
    if not 1 <= num_clusters <= n:
        raise ValueError(f"topology.num_lps: {num_clusters} clusters for {n} users")
    if n == 1:
        return np.zeros(1, dtype=np.int64), np.empty((0, 4))
    z = hac_linkage(similarity, linkage)
    labels = cut_tree(z, n_clusters=num_clusters).ravel()
    return canonical_labels(labels), z


def random_same_sizes(labels, seed: int) -> np.ndarray:
    """Random clusters with the sizes of `labels`: a seeded permutation of the users."""
    labels = np.asarray(labels)
    shuffled = labels[np.random.default_rng(seed).permutation(labels.size)]
    return canonical_labels(shuffled)
