"""One-shot data-similarity clustering for multi-task hierarchical FL (GPS + T LPSs).

Ali & Arafa, "Data Similarity-Based One-Shot Clustering for Multi-Task Hierarchical
Federated Learning"; docs/ALGORITHMS.md §17.

Round 1, clustering (only eigenvectors and relevance values travel):
    user i:  Σ_i = Φ(X_i)ᵀΦ(X_i)/n_i, (λ_i, V_i) top-k eigenpairs     (V_i ∈ R^{k×d} to every j)
    user i:  λ̂_k = ‖Σ_i v_k^{(j)}‖,  r(i,j) = Π_k (min(λ_k^{(i)},λ̂_k)/max(λ_k^{(i)},λ̂_k))^{1/k}
                                                                      (row r(i,·) to the GPS)
    GPS:     R = (r + rᵀ)/2 (step `similarity`) → graph: HAC(1 − R, linkage) into T clusters
             U_1..U_T (step `cluster`)
    GPS:     tells LPS k its users U_k and every user its LPS
    clustering = random: same cluster sizes, users permuted (seeded); oracle: U_k = true task k.
Every round t (hierarchical FedAvg inside the clusters; common layers c across them):
    user i ∈ U_k:  w_i ← LocalSGD(w_k, E epochs, lr)
    LPS k:         w_k ← Σ_{i∈U_k} n_i·w_i / Σ_{i∈U_k} n_i
    if t mod global_every = 0:
      GPS:         c ← Σ_k N_k·c_k / Σ_k N_k,  N_k = Σ_{i∈U_k} n_i;   c_k ← c
    LPS k sends w_k to its users.
Users of different tasks may share an LPS: their task layers are averaged only among users
of the same task, the common layers among all (algorithms/hierarchy.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from raymtl.algorithms.aggregate import by_sender
from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    client_name,
    index_of,
    lps_name,
)
from raymtl.algorithms.hierarchy import (
    CommonLayers,
    common_of,
    lps_broadcast,
    replies_by_signature,
    shape_average,
    signature,
)
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import derive_seed, load_received, model_tensors, train_local_model
from raymtl.data.features import feature_map
from raymtl.graph import clustering as hac

GRAPH = "graph"


class OneShotHFLParams(LocalTrainingParams):
    clustering: Literal["oneshot", "random", "oracle"] = Field(
        "oneshot", description="oneshot (data similarity), random (same sizes), oracle (tasks)"
    )
    num_eigen: int = Field(5, ge=1, description="k: eigenvectors each user shares")
    linkage: Literal["average", "complete", "single", "weighted"] = "average"
    feature_map: Literal["auto", "identity", "pretrained", "random_projection"] = Field(
        "auto", description="Φ: auto = identity for grey, local pretrained or projection for RGB"
    )
    projection_dim: int = Field(256, ge=1, description="d of the seeded random projection")
    global_every: int = Field(1, ge=1, description="GPS aggregation every this many rounds")
    common_prefixes: tuple[str, ...] | None = Field(
        None, description="parameter-name prefixes shared by the GPS; null = the model's own"
    )


def lps_of(labels) -> list[int]:
    """Cluster labels -> LPS index (clusters named by their smallest member)."""
    return [int(label) for label in hac.canonical_labels(labels)]


@register_algorithm
class OneShotHFL(CommonLayers, Algorithm):
    name = "oneshot_hfl"
    toolbox = ("aggregation", "uplink")  # LPS and GPS means; DP and optimisers: star only
    toolbox_refusals = {
        "privacy": "central DP is a server's over its sampled clients; here LPSs sum their users",
        "server_optimizer": "the GPS merges common layers into LPSs, not a model of its own",
    }
    summary = "One-shot data-similarity clustering of users into LPSs, then hierarchical FedAvg"
    Params = OneShotHFLParams
    shapes = ("hierarchical",)
    inputs = ("images", "vectors")
    input_refusal = "its clustering compares the users' features Φ(x); token ids are no features"
    uses_graph = True
    task_support = "different"

    def phases(self, round_index, rounds):
        phases = self.clustering_phases() if round_index == 1 else []
        phases += [Phase("client", "train", "all", trains=True), Phase("lps", "aggregate", "inbox")]
        if round_index % self.params.global_every == 0:
            phases.append(Phase("server", "aggregate_common", "inbox"))
        return phases + [Phase("lps", "broadcast", "all"), Phase("client", "receive", "inbox")]

    def clustering_phases(self) -> list[Phase]:
        if self.params.clustering == "oracle":
            return [Phase("server", "assign", "all")]
        return [
            Phase("client", "eigen", "all"),
            Phase("client", "relevance", "all"),
            Phase("server", "similarity", "all"),
            Phase("graph", "cluster", "inbox"),
            Phase("server", "assign", "inbox"),
        ]

    # -- clustering, round 1 -------------------------------------------------------------
    def eigen(self, state, inbox, ctx):
        x = state.data.train_x
        phi, used = feature_map(
            x, self.params.feature_map, derive_seed(ctx.seed, "phi"), self.params.projection_dim
        )
        gram = hac.gram_matrix(phi)
        values, vectors = hac.top_eigenpairs(gram, self.params.num_eigen)
        state.extras["gram"], state.extras["eigenvalues"] = gram, values
        ctx.record(
            "oneshot_features",
            client=ctx.index,
            feature_map=used,
            dim=int(phi.shape[1]),
            k=int(values.size),
            samples=int(phi.shape[0]),
        )
        shared = {"eigenvectors": torch.from_numpy(vectors.T.astype(np.float32))}  # (k, d)
        peers = [j for j in range(ctx.federation.num_clients) if j != ctx.index]
        return state, [Message(ctx.me, client_name(j), "eigenvectors", shared) for j in peers]

    def relevance(self, state, inbox, ctx):
        gram, values = state.extras.pop("gram"), state.extras.pop("eigenvalues")
        others = {index_of(m.src): m.tensors["eigenvectors"].numpy().T for m in inbox}
        row = np.ones(ctx.federation.num_clients)  # r(i, i) = 1
        for j, r in hac.relevance_row(gram, values, others).items():
            row[j] = r
        return state, [Message(ctx.me, SERVER, "relevance", {"r": torch.tensor(row).float()})]

    def similarity(self, state, inbox, ctx):
        n = ctx.federation.num_clients
        r = np.eye(n)
        for message in by_sender(inbox):
            r[index_of(message.src)] = message.tensors["r"].double().numpy()
        similarity = hac.symmetric_relevance(r)
        for i in range(n):
            for j in range(n):
                r_ij, big_r = float(r[i, j]), float(similarity[i, j])
                ctx.record("oneshot_relevance", i=i, j=j, r=r_ij, R=big_r)
        tensors = {"R": torch.from_numpy(similarity).float()}
        return state, [Message(SERVER, GRAPH, "similarity", tensors)]

    def cluster(self, state, inbox, ctx):
        (message,) = inbox
        similarity = message.tensors["R"].double().numpy()
        labels, z = hac.hac_clusters(similarity, ctx.federation.num_lps, self.params.linkage)
        for step, (a, b, distance, size) in enumerate(z.tolist()):
            ctx.record(
                "oneshot_linkage", step=step, a=int(a), b=int(b), distance=distance, size=int(size)
            )
        state.extras["hac"] = labels.tolist()
        if self.params.clustering == "random":
            labels = hac.random_same_sizes(labels, derive_seed(ctx.seed, "random-clusters"))
        clusters = torch.tensor(labels, dtype=torch.int32)
        return state, [Message(GRAPH, SERVER, "clusters", {"clusters": clusters})]

    def check_resources(self, federation, memory_budget):
        """Oracle clustering puts each task in an LPS of its own: it needs as many LPSs as
        tasks (refused before the run, never in round 1's assign step)."""
        tasks = len(set(federation.tasks))
        if self.params.clustering == "oracle" and tasks > federation.num_lps:
            raise ValueError(
                f"topology.num_lps: {federation.num_lps} LPSs for {tasks} tasks; oracle "
                "clustering needs one LPS a task"
            )

    def assign(self, state, inbox, ctx):
        fed = ctx.federation
        if self.params.clustering == "oracle":
            if len(set(fed.tasks)) > fed.num_lps:
                raise ValueError(f"topology.num_lps: {fed.num_lps} LPSs for more tasks")
            assignment = lps_of(fed.tasks)
        else:
            (message,) = inbox
            assignment = lps_of(message.tensors["clusters"].tolist())
        state.extras["lps_of_client"] = assignment
        for i, k in enumerate(assignment):
            ctx.record(
                "oneshot_clusters",
                client=i,
                lps=k,
                task=int(fed.tasks[i]),
                method=self.params.clustering,
            )
        outbox = []
        for k in range(fed.num_lps):
            users = [i for i, c in enumerate(assignment) if c == k]
            members = torch.tensor(users, dtype=torch.int32)
            outbox.append(Message(SERVER, lps_name(k), "membership", {"members": members}))
        for i, k in enumerate(assignment):
            lps = {"lps": torch.tensor([k], dtype=torch.int32)}
            outbox.append(Message(SERVER, client_name(i), "membership", lps))
        return state, outbox

    # -- training, every round -------------------------------------------------------------
    def train(self, state, inbox, ctx):
        for message in inbox:  # round 1: the GPS names this user's LPS
            state.extras["lps"] = int(message.tensors["lps"][0])
        train_local_model(state, ctx, self.params)
        lps = lps_name(state.extras["lps"])
        return state, [Message(ctx.me, lps, "model", model_tensors(state.model))]

    def aggregate(self, state, inbox, ctx):
        samples = ctx.federation.samples
        models = [m for m in by_sender(inbox) if m.kind == "model"]
        for message in inbox:
            if message.kind == "membership":
                state.extras["members"] = message.tensors["members"].tolist()
        # Task layers mix only among users whose tasks are of one kind (never across kinds).
        common, tasks = self.common_prefixes(), ctx.federation.task_kinds()
        keys = {
            index_of(m.src): signature(m.tensors, tasks[index_of(m.src)], common) for m in models
        }
        updates = [(m.tensors, samples[index_of(m.src)], keys[index_of(m.src)]) for m in models]
        state.extras["model"], state.extras["shapes"] = shape_average(updates, ctx), keys
        if ctx.round % self.params.global_every != 0 or not models:
            return state, []
        shared = common_of(state.extras["model"], common, ctx.me)
        return state, [Message(ctx.me, SERVER, "common", shared)]

    def aggregate_common(self, state, inbox, ctx):
        assignment, samples = state.extras["lps_of_client"], ctx.federation.samples
        weight = defaultdict(int)
        for i, k in enumerate(assignment):
            weight[k] += samples[i]
        messages = by_sender(inbox)
        updates = [(m.tensors, weight[index_of(m.src)], signature(m.tensors)) for m in messages]
        store = shape_average(updates, ctx)
        return state, replies_by_signature(store, messages, SERVER, "common")

    def broadcast(self, state, inbox, ctx):
        keys = state.extras.get("shapes", {})
        return state, lps_broadcast(state, inbox, keys, ctx.me)

    def receive(self, state, inbox, ctx):
        load_received(state.model, inbox)
        return state, []
