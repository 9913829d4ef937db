"""SFMTL-Graph — selective federated multi-task learning over a dynamic similarity graph.

Paper: "SFMTL-Graph"; the maths is docs/ALGORITHMS.md §9.

Round t, S_t = ⌈m·N⌉ sampled clients; client i holds backbone φ_i, linear head h_i and an
anchor A_i (one row per class, d = backbone output; round 1: seeded N(0,1) rows, L2-normed):
    client i ∈ S_t:  E epochs of SGD on
                       CE(h_i(φ_i(x)), y) + λ_a·(1/C)·Σ_b ‖φ_i(x_b) − A_i[y_b]‖² / n_{y_b}
                     (n_c = samples of class c in the batch, C = rows of A_i); per epoch
                     m_c ← μ·m_c + (1−μ)·mean_{b: y_b=c} φ_i(x_b) from m = A_i, then A_i[c] ← m_c,
                     c ∈ Y_i. Upload h_i, A_i[Y_i], Y_i (the backbone never leaves the client).
    graph service:   s_ij = max(0, α·FS_ij + (1−α)·AS_ij) (raymtl.graph.similarity) over S_t,
                     communities by Louvain or Leiden modularity (raymtl.graph.communities).
    server, per community c, from the heads as uploaded (simultaneous):
                     h_i ← h_i − η_g·λ·Σ_{j∈c, j≠i} s_ij·(h_i − h_j),   η_g = lr·E
                     Ā_c[k] = Σ_{j∈c, k∈Y_j} n_j·A_j[k] / Σ_{j∈c, k∈Y_j} n_j
                     (= Σ_{j∈c} n_j/Σ n·A_j when the members share their classes, as the
                     paper's groups do; a class only some members hold averages over those)
    client i ∈ S_t:  h_i ← reply, A_i[Y_i] ← Ā_{c(i)}[Y_i].
Uplink per sampled client: |h| + |Y_i|·d floats (+ |Y_i| class ids); downlink the same.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from raymtl.algorithms.aggregate import by_sender, is_finite
from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    client_name,
    index_of,
)
from raymtl.algorithms.fedu import laplacian_step
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import derive_seed, load_tensors, local_sgd, model_tensors
from raymtl.graph.communities import detect_communities, modularity
from raymtl.graph.similarity import similarity_graph, view_from_payload

GRAPH = "graph"
HEAD = "head."


class SFMTLGraphParams(LocalTrainingParams):
    epochs: int = Field(5, ge=1, description="local epochs per round (E)")
    lr: float = Field(0.05, gt=0, description="local SGD learning rate (η_g = lr·E)")
    clip_grad: float | None = Field(1.0, gt=0, description="max gradient norm; null = off")
    sample_fraction: float = Field(0.5, gt=0, le=1, description="fraction m of clients sampled")
    lambda_anchor: float = Field(0.1, ge=0, description="anchor loss weight λ_a")
    anchor_momentum: float = Field(0.5, ge=0, le=1, description="EMA momentum μ of the anchor")
    alpha: float = Field(0.49, ge=0, le=1, description="s_ij = α·FS + (1−α)·AS")
    lam: float = Field(0.03, ge=0, description="head Laplacian strength λ in the community")
    community: Literal["louvain", "leiden"] = Field(
        "louvain", description="community detection: louvain (paper) or leiden"
    )
    resolution: float = Field(1.0, gt=0, description="modularity resolution γ (1 = paper)")


def initial_anchor(num_classes: int, dim: int, seed: int) -> torch.Tensor:
    """Round-1 anchor: rows of a seeded standard normal, L2-normalised (same for all clients)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "anchor-init"))
    return F.normalize(torch.randn(num_classes, dim, generator=generator), dim=1)


def anchor_loss(features: torch.Tensor, y: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """(1/C)·Σ_b ‖φ(x_b) − A[y_b]‖² / n_{y_b}, C = rows of the anchor."""
    counts = torch.bincount(y, minlength=anchor.shape[0]).to(features.dtype)
    distances = ((features - anchor[y]) ** 2).sum(dim=1)
    return (distances / counts[y]).sum() / anchor.shape[0]


class AnchorTraining:
    """The local loss (CE + λ_a·anchor loss) with the per-epoch EMA anchor refresh.

    Called once per batch by `local_sgd`; after the last batch of each epoch,
    A[c] ← m_c for the client's classes and the EMA restarts from A.
    """

    def __init__(self, anchor, classes, params: SFMTLGraphParams, batches_per_epoch: int):
        self.anchor = anchor.clone()
        self.ema = anchor.clone()
        self.classes = classes
        self.params = params
        self.batches_per_epoch = batches_per_epoch
        self.calls = 0

    def __call__(self, model, x, y):
        features = model.features(x)
        loss = F.cross_entropy(model.head(features), y)
        if self.params.lambda_anchor:
            loss = loss + self.params.lambda_anchor * anchor_loss(features, y, self.anchor)
        self.refresh(features.detach(), y)
        return loss

    @torch.no_grad()
    def refresh(self, features: torch.Tensor, y: torch.Tensor) -> None:
        """m_c ← μ·m_c + (1−μ)·batch mean of class c; commit at the epoch's end."""
        mu = self.params.anchor_momentum
        for c in torch.unique(y).tolist():
            self.ema[c] = mu * self.ema[c] + (1 - mu) * features[y == c].mean(dim=0)
        self.calls += 1
        if self.calls % self.batches_per_epoch == 0:
            self.anchor[self.classes] = self.ema[self.classes]
            self.ema = self.anchor.clone()


def community_anchors(
    anchors: dict[int, dict[int, torch.Tensor]], labels: dict[int, int], samples
) -> dict[int, dict[int, torch.Tensor]]:
    """Ā_c per community: {community: {class: Σ n_j·A_j[k] / Σ n_j over members holding k}}."""
    sums: dict[int, dict[int, list]] = {}
    for i in sorted(anchors):
        per_class = sums.setdefault(labels[i], {})
        for k, row in anchors[i].items():
            total = per_class.setdefault(k, [torch.zeros_like(row), 0.0])
            total[0] = total[0] + samples[i] * row
            total[1] += samples[i]
    return {
        c: {k: vector / weight for k, (vector, weight) in per_class.items()}
        for c, per_class in sums.items()
    }


def community_weights(clients, labels, s) -> dict[int, dict[int, float]]:
    """{i: {j: s_ij}} for j in i's community (j ≠ i)."""
    values = torch.as_tensor(s).tolist()  # one conversion, not S² element reads
    return {
        i: {j: values[a][b] for b, j in enumerate(clients) if b != a and labels[a] == labels[b]}
        for a, i in enumerate(clients)
    }


def record_graph(ctx, graph, labels, views, quality: float) -> None:
    """One graph.parquet row per ordered pair (i, j) of sampled clients (diagonal: NaN).

    `true_group_i` (rotation group : class set) is what the reports score communities against.
    """
    groups, nan = ctx.federation.groups, float("nan")
    s, fs, as_ = (torch.as_tensor(m).tolist() for m in (graph.s, graph.fs, graph.as_))
    for a, i in enumerate(graph.clients):
        classes = "-".join(str(c) for c in sorted(views[i].anchors))
        truth = f"{groups[i] if groups else 0}:{classes}"
        for b, j in enumerate(graph.clients):
            same = a == b
            ctx.record(
                GRAPH,
                i=i,
                j=j,
                s_ij=nan if same else s[a][b],
                fs_ij=nan if same else fs[a][b],
                as_ij=nan if same else as_[a][b],
                community_i=int(labels[a]),
                true_group_i=truth,
                modularity=quality,
            )


@register_algorithm
class SFMTLGraph(Algorithm):
    name = "sfmtl_graph"
    combines_otherwise = "graph-weighted mixing within each community"
    summary = "SFMTL-Graph: heads + feature anchors, similarity graph communities, Laplacian heads"
    Params = SFMTLGraphParams
    shapes = ("star",)
    task_support = "labels"  # the update uses class labels (cross-entropy)
    uses_graph = True

    def phases(self, round_index, rounds):
        return [
            Phase("client", "train", "sampled", trains=True),
            Phase("server", "forward", "inbox"),
            Phase("graph", "communities", "inbox"),
            Phase("server", "aggregate", "inbox"),
            Phase("client", "receive", "inbox"),
        ]

    def client_anchor(self, state, ctx) -> torch.Tensor:
        if "anchor" not in state.extras:
            model = state.model
            anchor = initial_anchor(state.data.num_classes, model.feature_dim, ctx.seed)
            state.extras["anchor"] = anchor.to(next(model.parameters()).device)
            state.extras["classes"] = sorted(torch.unique(state.data.train_y).tolist())
        return state.extras["anchor"]

    def train(self, state, inbox, ctx):
        data, params = state.data, self.params
        anchor, classes = self.client_anchor(state, ctx), state.extras["classes"]
        batches = -(-len(data.train_y) // params.batch_size)
        training = AnchorTraining(anchor, classes, params, batches)
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
        state.extras["train_loss"] = local_sgd(
            state.model, data.train_x, data.train_y, params, seed, loss_fn=training
        ).loss
        state.extras["anchor"] = training.anchor
        upload = {
            **model_tensors(state.model, [HEAD]),
            "anchor": training.anchor[classes].detach().to("cpu", copy=True),
            "classes": torch.tensor(classes, dtype=torch.int32),
        }
        return state, [Message(ctx.me, SERVER, "head_anchor", upload)]

    def forward(self, state, inbox, ctx):
        """Keep the uploads for the aggregation; pass the same dicts on to the graph service.

        Forwarding the inbox dict unchanged reuses the stored payload (no copy).
        """
        usable = [m for m in by_sender(inbox) if is_finite(m.tensors)]
        state.extras["uploads"] = {index_of(m.src): m.tensors for m in usable}
        # The kind names the client ("upload/<i>"): the sender of a forward is the server.
        return state, [
            Message(SERVER, GRAPH, f"upload/{index_of(m.src)}", m.tensors) for m in usable
        ]

    def communities(self, state, inbox, ctx):
        """Similarity graph over the sampled clients, its communities, one row per (i, j)."""
        views = {index_of(m.kind): view_from_payload(m.tensors) for m in inbox}
        graph = similarity_graph(views, self.params.alpha)
        seed = derive_seed(ctx.seed, ctx.round, "communities")
        labels = detect_communities(
            graph.s, self.params.community, seed, resolution=self.params.resolution
        )
        record_graph(ctx, graph, labels, views, modularity(graph.s, labels, self.params.resolution))
        result = {
            "clients": torch.tensor(graph.clients, dtype=torch.int32),
            "community": torch.tensor(labels, dtype=torch.int32),
            "similarity": torch.tensor(graph.s, dtype=torch.float32),
        }
        return state, [Message(GRAPH, SERVER, "communities", result)] if graph.clients else []

    def aggregate(self, state, inbox, ctx):
        """Community anchors and the simultaneous Laplacian head step; reply to each client."""
        uploads = state.extras.pop("uploads", {})
        if not inbox:
            return state, []
        result = inbox[0].tensors
        clients = [int(i) for i in result["clients"].tolist()]
        labels = dict(zip(clients, result["community"].tolist(), strict=True))
        heads = {i: {k: v for k, v in uploads[i].items() if k.startswith(HEAD)} for i in clients}
        weights = community_weights(clients, list(labels.values()), result["similarity"])
        step = self.params.lr * self.params.epochs * self.params.lam
        # s_ij counts only within a community, so the Laplacian is block-diagonal: one
        # product per community (Σ_c |c|² rows × columns instead of |S_t|²).
        new_heads: dict[int, dict[str, torch.Tensor]] = {}
        for community in sorted(set(labels.values())):
            members = [i for i in clients if labels[i] == community]
            new_heads |= laplacian_step(
                {i: heads[i] for i in members}, {i: weights[i] for i in members}, step
            )
        classes = {i: [int(c) for c in uploads[i]["classes"].tolist()] for i in clients}
        anchors = {i: dict(zip(classes[i], uploads[i]["anchor"], strict=True)) for i in clients}
        means = community_anchors(anchors, labels, ctx.federation.samples)
        outbox = []
        for i in clients:
            rows = torch.stack([means[labels[i]][k] for k in classes[i]])
            reply = {**new_heads[i], "anchor": rows}
            outbox.append(Message(SERVER, client_name(i), "head_anchor", reply))
        return state, outbox

    def receive(self, state, inbox, ctx):
        for message in inbox:
            tensors = dict(message.tensors)
            rows = tensors.pop("anchor")
            load_tensors(state.model, tensors)
            anchor = state.extras["anchor"]
            anchor[state.extras["classes"]] = rows.to(anchor.device, anchor.dtype)
        return state, []
