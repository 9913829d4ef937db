"""SFMTL-Graph's task similarity between clients: functional head similarity + anchor similarity.

Paper: "SFMTL-Graph" (§IV-A); the maths in docs/ALGORITHMS.md, SFMTL-Graph.

Client i uploads a linear head h_i(z) = W_i z + b_i and anchor rows A_i[c] for its classes
c ∈ Y_i. Over the shared classes Y_ij = Y_i ∩ Y_j (all three are 0 when Y_ij is empty):
    FS_ij = ½ Σ_{A ∈ {A_i, A_j}} mean_{c∈Y_ij} cos(h_i(A[c]), h_j(A[c]))
    AS_ij = mean_{c∈Y_ij} cos(A_i[c], A_j[c])
    s_ij  = max(0, α·FS_ij + (1−α)·AS_ij)
Pure torch/numpy: used by the graph service, tests and benchmarks alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ClientView:
    """What the server knows of one sampled client: its linear head and anchor rows."""

    weight: torch.Tensor  # (C, d)
    bias: torch.Tensor  # (C,)
    anchors: dict[int, torch.Tensor]  # class -> (d,) anchor row, classes Y_i only

    def head(self, z: torch.Tensor) -> torch.Tensor:
        """Logits h(z) = W z + b (dropout is off outside training)."""
        return z @ self.weight.T + self.bias


def view_from_payload(tensors: dict[str, torch.Tensor]) -> ClientView:
    """Unpack an SFMTL upload: '<head>.weight', '<head>.bias', 'anchor' rows, 'classes'."""
    weights = [name for name in tensors if name.startswith("head.") and name.endswith("weight")]
    if len(weights) != 1:
        raise ValueError(f"SFMTL-Graph needs a single linear head, got {sorted(weights)}")
    prefix = weights[0].removesuffix("weight")
    classes = [int(c) for c in tensors["classes"].tolist()]
    anchors = tensors["anchor"].float()
    return ClientView(
        weight=tensors[weights[0]].float(),
        bias=tensors[f"{prefix}bias"].float(),
        anchors={c: anchors[k] for k, c in enumerate(classes)},
    )


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.flatten(), b.flatten(), dim=0, eps=1e-12))


def pair_similarity(a: ClientView, b: ClientView, alpha: float) -> tuple[float, float, float]:
    """(s_ij, FS_ij, AS_ij) of two clients; all 0 when they share no class."""
    shared = sorted(set(a.anchors) & set(b.anchors))
    if not shared:
        return 0.0, 0.0, 0.0
    functional = 0.0
    for anchors in (a.anchors, b.anchors):
        functional += np.mean([_cos(a.head(anchors[c]), b.head(anchors[c])) for c in shared])
    fs = 0.5 * float(functional)
    as_ = float(np.mean([_cos(a.anchors[c], b.anchors[c]) for c in shared]))
    return max(0.0, alpha * fs + (1 - alpha) * as_), fs, as_


@dataclass(frozen=True)
class SimilarityGraph:
    """s, FS and AS over an ordered list of clients (diagonal 0: no self-loops)."""

    clients: tuple[int, ...]
    s: np.ndarray
    fs: np.ndarray
    as_: np.ndarray


def similarity_graph(views: dict[int, ClientView], alpha: float) -> SimilarityGraph:
    """All pairwise similarities of the given clients (sorted by client index)."""
    clients = tuple(sorted(views))
    n = len(clients)
    s, fs, as_ = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n))
    for a in range(n):
        for b in range(a + 1, n):
            values = pair_similarity(views[clients[a]], views[clients[b]], alpha)
            for matrix, value in zip((s, fs, as_), values, strict=True):
                matrix[a, b] = matrix[b, a] = value
    return SimilarityGraph(clients, s, fs, as_)
