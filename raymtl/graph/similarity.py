"""SFMTL-Graph's task similarity between clients: functional head similarity + anchor similarity.

Paper: "SFMTL-Graph" (§IV-A); the maths in docs/ALGORITHMS.md, SFMTL-Graph.

Client i uploads a linear head h_i(z) = W_i z + b_i and anchor rows A_i[c] for its classes
c ∈ Y_i. Over the shared classes Y_ij = Y_i ∩ Y_j (all three are 0 when Y_ij is empty):
    FS_ij = ½ Σ_{A ∈ {A_i, A_j}} mean_{c∈Y_ij} cos(h_i(A[c]), h_j(A[c]))
    AS_ij = mean_{c∈Y_ij} cos(A_i[c], A_j[c])
    s_ij  = max(0, α·FS_ij + (1−α)·AS_ij)
cos(x, y) = ⟨x/max(‖x‖, ε), y/max(‖y‖, ε)⟩ with ε = 1e-12 (F.cosine_similarity's clamp of each
norm on its own), so a zero row has cosine 0 with anything.

`pair_similarity` is the spec's plain form for one pair; `pairwise_similarity_graph` loops it
over all pairs (the reference the tests hold the batched form to). `similarity_graph`, what
the graph service runs, computes every pair at once, one class at a time: a class c enters
only the pairs that both hold it, H_c = {i : c ∈ Y_i} (n_c clients). Stack the heads
W (S, K, d), b (S, K) and, per class, the holders' anchor rows A_c (n_c, d); then for
i, j ∈ H_c
    P_c[i, j] = cos(h_i(A_j[c]), h_j(A_j[c]))   (one (n_c·K, d) × (d, n_c) product of logits,
                                                 each unit-normalised over its K entries)
    Q_c[i, j] = cos(A_i[c], A_j[c])            (Â_c Â_cᵀ, Â_c the unit rows)
and with n_ij = Σ_c [i, j ∈ H_c] = |Y_ij| (M Mᵀ, M the (S, C) class mask):
    F_ij  = Σ_c P_c[i, j] / n_ij   (anchors A_j; F_ji uses A_i, as cos is symmetric)
    FS    = ½(F + Fᵀ),   AS_ij = Σ_c Q_c[i, j] / n_ij,   s as above,
0 where n_ij = 0 and on the diagonal. The work is Σ_c n_c²·(K + 1)·d multiply-adds in
float64 (S²·C·(K + 1)·d when every client holds every class; a fifth of the classes per
client is 1/25 of that); the (rows, K, n_c) logits are built a block of rows at a time, so
memory stays bounded at large S.
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


COSINE_EPS = 1e-12
# Elements of the largest (rows, K, n_c) block of logits `similarity_graph` builds at once
# (2^22 float64 = 32 MiB; a few such temporaries live together): one block per class up to
# n_c ≈ 650 holders at K = 10, blocks of rows beyond.
BLOCK_ELEMENTS = 1 << 22


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.flatten(), b.flatten(), dim=0, eps=COSINE_EPS))


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


def pairwise_similarity_graph(views: dict[int, ClientView], alpha: float) -> SimilarityGraph:
    """All pairwise similarities by `pair_similarity` pair by pair: the spec's plain form.

    The reference `similarity_graph` is tested against: S(S−1)/2 Python calls, ~2 s of CPU at
    S = 100 cnn_mnist-sized clients holding all 10 classes (benchmarks/similarity_graph.py).
    """
    clients = tuple(sorted(views))
    n = len(clients)
    s, fs, as_ = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n))
    for a in range(n):
        for b in range(a + 1, n):
            values = pair_similarity(views[clients[a]], views[clients[b]], alpha)
            for matrix, value in zip((s, fs, as_), values, strict=True):
                matrix[a, b] = matrix[b, a] = value
    return SimilarityGraph(clients, s, fs, as_)


@dataclass(frozen=True)
class StackedViews:
    """S clients' heads and anchors as dense tensors (float64 by default); classes as columns."""

    weight: torch.Tensor  # (S, K, d)
    bias: torch.Tensor  # (S, K)
    anchors: torch.Tensor  # (S, C, d), zero rows for the classes a client lacks
    mask: torch.Tensor  # (S, C) bool, M[i, c] = c ∈ Y_i
    classes: tuple[int, ...]  # the class of each of the C columns
    # H_c of each column: the rows holding it, ascending. Known from the views' class sets,
    # so a class's shapes never wait on the device (`nonzero` of the mask would).
    holders: tuple[tuple[int, ...], ...]


def stack_views(views: list[ClientView], dtype: torch.dtype = torch.float64) -> StackedViews:
    """Stack the views' heads, anchor rows and class sets (heads must share their shape), on
    the heads' device."""
    classes = tuple(sorted(set().union(*(view.anchors for view in views))))
    column = {c: k for k, c in enumerate(classes)}
    weight = torch.stack([view.weight.to(dtype) for view in views])
    bias = torch.stack([view.bias.to(dtype) for view in views])
    device = weight.device
    anchors = torch.zeros(len(views), len(classes), weight.shape[-1], dtype=dtype, device=device)
    mask = torch.zeros(len(views), len(classes), dtype=torch.bool, device=device)
    for row, view in enumerate(views):
        if view.anchors:
            columns = torch.tensor([column[c] for c in view.anchors], device=device)
            anchors[row, columns] = torch.stack(list(view.anchors.values())).to(device, dtype)
            mask[row, columns] = True
    holders = tuple(
        tuple(row for row, view in enumerate(views) if c in view.anchors) for c in classes
    )
    return StackedViews(weight, bias, anchors, mask, classes, holders)


def shared_sums(
    stacked: StackedViews, block_elements: int = BLOCK_ELEMENTS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ_c P_c[i, j], Σ_c Q_c[i, j], n_ij), each (S, S), the sums over c ∈ Y_ij (see above).

    Per class, rows i go in blocks of at most `block_elements` logits (rows·K·n_c): beyond
    the (S, S) results nothing grows as S².
    """
    weight, bias, anchors, mask = stacked.weight, stacked.bias, stacked.anchors, stacked.mask
    clients, logits_per_client, dim = weight.shape
    functional = torch.zeros(clients, clients, dtype=anchors.dtype, device=anchors.device)
    anchor = torch.zeros(clients, clients, dtype=anchors.dtype, device=anchors.device)
    counts = mask.to(anchors.dtype) @ mask.to(anchors.dtype).T
    for column in range(anchors.shape[1]):
        holders = torch.tensor(stacked.holders[column], dtype=torch.long, device=anchors.device)
        rows_c = anchors[holders, column]  # (n_c, d)
        unit_rows = F.normalize(rows_c, dim=-1, eps=COSINE_EPS)
        anchor[holders[:, None], holders] += unit_rows @ unit_rows.T  # Q_c
        heads, biases = weight[holders], bias[holders]
        # h_j(A_j[c]) for every holder j, unit-normalised: (K, n_c).
        own = torch.einsum("jkd,jd->kj", heads, rows_c) + biases.T
        own_unit = F.normalize(own, dim=0, eps=COSINE_EPS)
        count = holders.numel()
        rows = max(1, block_elements // max(1, logits_per_client * count))
        for first in range(0, count, rows):
            block = slice(first, min(first + rows, count))
            size = block.stop - block.start
            # h_i(A_j[c]) for i in the block, every holder j: (size, K, n_c).
            logits = (heads[block].reshape(size * logits_per_client, dim) @ rows_c.T).view(
                size, logits_per_client, count
            )
            logits += biases[block, :, None]
            unit = F.normalize(logits, dim=1, eps=COSINE_EPS)
            functional[holders[block, None], holders] += (unit * own_unit).sum(dim=1)  # P_c
    return functional, anchor, counts


def similarity_graph(views: dict[int, ClientView], alpha: float) -> SimilarityGraph:
    """All pairwise similarities of the given clients (sorted by client index), batched.

    Equal to `pairwise_similarity_graph` up to float rounding (its cosines are float32).
    """
    clients = tuple(sorted(views))
    if not clients:
        return SimilarityGraph(clients, np.zeros((0, 0)), np.zeros((0, 0)), np.zeros((0, 0)))
    s, fs, as_ = similarity_matrices([views[i] for i in clients], alpha)
    return SimilarityGraph(clients, s.cpu().numpy(), fs.cpu().numpy(), as_.cpu().numpy())


def similarity_matrices(
    views: list[ClientView], alpha: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s, FS, AS) of `views` in their order, float64 tensors on the views' device (the tensor
    part of `similarity_graph`; at least one view)."""
    functional, anchor, counts = shared_sums(stack_views(views))
    # n_ij = 0: the sums are 0 too; divide by 1 there so FS = AS = s = 0.
    divisor = counts.clamp_min(1.0)
    fs_one_way = functional / divisor  # anchors of j
    fs = 0.5 * (fs_one_way + fs_one_way.T)
    as_ = anchor / divisor
    s = (alpha * fs + (1 - alpha) * as_).clamp_min(0.0)
    for matrix in (s, fs, as_):
        matrix.fill_diagonal_(0.0)
    return s, fs, as_
