"""IFCA — the Iterative Federated Clustering Algorithm (baseline, clustered FL).

Ghosh, Chung, Yin and Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020; the model-averaging variant (the paper's option II).

The server holds K cluster models θ_0..θ_{K−1} (`clusters`). θ_0 is the model factory's
seeded init; θ_j (j ≥ 1) permutes every tensor of it entry by entry, seeded by (seed, j,
name): the same init distribution, K different starting points (equal ones would send every
client to cluster 0). Round t, with S_t the sampled clients (⌈m·N⌉ of N) and f_k the mean
loss of the client's task on its training data:
    server:          θ_0..θ_{K−1} to every k ∈ S_t
    client k ∈ S_t:  ĵ_k = argmin_j f_k(θ_j) (ties: the lowest j)
                     θ_k ← LocalSGD(θ_ĵ, E epochs, lr)              → server, with ĵ_k
    server, per j:   θ_j ← Σ_{k: ĵ_k = j} n_k·θ_k / Σ_{k: ĵ_k = j} n_k
                     (a cluster no client picked keeps its model)
Evaluation: the server sends θ_0..θ_{K−1} to every client (all are evaluated), counted as
traffic (kind "cluster_models_eval"); client k picks ĵ_k = argmin_j f_k(θ_j) on its training
data, as in training, and is evaluated with θ_ĵ. This downlink goes out only after the rounds
that are evaluated (`ctx.evaluated`: every `eval_every` rounds and the last).

Each pick is a row of `ifca_clusters.parquet`: (seed, round, client, cluster, stage, group, task,
loss), stage "train" (k ∈ S_t, the cluster it trained) or "eval" (every client, the cluster
it is evaluated with); `group` and `task` are the client's true rotation/mask group and task,
against which a report scores the picks (adjusted Rand index).

Bits per round: down (|S_t| + N)·K·|θ|·32 in an evaluated round, |S_t|·K·|θ|·32 in
another (K models for training, K models for evaluation), up |S_t|·(|θ|·32 + 64) (the
trained model and ĵ as one int64).
A client keeps the model it is evaluated with and its last pick between rounds.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from raymtl.algorithms.aggregate import by_sender, combine, server_update
from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    State,
    client_name,
    index_of,
)
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import (
    derive_seed,
    evaluate,
    load_tensors,
    model_tensors,
    train_local_model,
)

CLUSTER = "cluster"  # the int64 entry of a client's upload: its pick ĵ
TRAIN_KIND, EVAL_KIND = "cluster_models", "cluster_models_eval"


class IFCAParams(LocalTrainingParams):
    clusters: int = Field(
        4, ge=1, le=64, description="K cluster models (the paper: the number of true groups)"
    )


def permuted(tensors: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Every tensor's entries in a seeded random order (same values, same shapes)."""
    out = {}
    for name, value in tensors.items():
        generator = torch.Generator().manual_seed(derive_seed(seed, name))
        order = torch.randperm(value.numel(), generator=generator)
        out[name] = value.reshape(-1)[order].reshape(value.shape).clone()
    return out


def initial_clusters(tensors: dict[str, torch.Tensor], k: int, seed: int) -> list[dict]:
    """θ_0 = the factory's init; θ_j (j ≥ 1) = its entries permuted, seeded by (seed, j)."""
    first = {name: value.clone() for name, value in tensors.items()}
    return [first] + [permuted(tensors, derive_seed(seed, "ifca-init", j)) for j in range(1, k)]


def pack(models: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """K models as one payload: entry `j/name` is θ_j's `name`."""
    return {f"{j}/{name}": value for j, model in enumerate(models) for name, value in model.items()}


def unpack(payload: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    models: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in payload.items():
        j, _, name = key.partition("/")
        models.setdefault(int(j), {})[name] = value
    return [models[j] for j in sorted(models)]


def pick_cluster(losses: list[float]) -> int:
    """argmin_j of the losses, the lowest j on ties; a non-finite loss never wins (all
    non-finite: cluster 0)."""
    best, best_loss = 0, math.inf
    for j, loss in enumerate(losses):
        if math.isfinite(loss) and loss < best_loss:
            best, best_loss = j, loss
    return best


def cluster_losses(state: State, models: list[dict]) -> list[float]:
    """f_k(θ_j) for every j: the mean loss of the client's task on its training data."""
    data, losses = state.data, []
    for tensors in models:
        load_tensors(state.model, tensors)
        losses.append(float(evaluate(state.model, data.train_x, data.train_y, data.task)["loss"]))
    return losses


def cluster_averages(
    updates: list[tuple[int, dict[str, torch.Tensor], float]],
    k: int,
    ctx=None,
    state: State | None = None,
    models: list[dict[str, torch.Tensor]] | None = None,
) -> dict[int, dict[str, torch.Tensor]]:
    """{j: Σ n_k·θ_k / Σ n_k over the updates that picked j} — or the experiment's
    aggregation rule, server optimiser and central DP (`aggregate.combine`, with θ_j the
    reference: each cluster is a server model of its own, `slot` j); a cluster without a
    (finite) update is absent (its model stays)."""
    averages = {}
    for j in range(k):
        reference = models[j] if models is not None else None
        picked = [(tensors, n) for c, tensors, n in updates if c == j]
        average = combine(picked, ctx, state, reference=reference, slot=f"/{j}")
        if average is not None:
            if reference is not None and state is not None:
                average = server_update(state, reference, average, ctx, slot=f"/{j}")
            averages[j] = average
    return averages


@register_algorithm
class IFCA(Algorithm):
    name = "ifca"
    summary = (
        "IFCA: K cluster models, each client trains the one of lowest loss (Ghosh et al. 2020)"
    )
    Params = IFCAParams
    shapes = ("star",)
    keeps = ("model", "extras")  # the model of its last pick (evaluation) and the pick
    toolbox = ("aggregation", "server_optimizer", "privacy", "uplink")

    def phases(self, round_index, rounds):
        return [
            Phase("server", "broadcast", "all"),
            Phase("client", "train", "sampled", trains=True),
            Phase("server", "aggregate", "inbox"),
            Phase("client", "choose", "inbox"),
        ]

    def init_state(self, participant, data, federation):
        if participant == SERVER:
            return State(model=self.model_factory(SERVER, federation.num_classes[0]))
        return super().init_state(participant, data, federation)

    def cluster_models(self, state: State, ctx) -> list[dict[str, torch.Tensor]]:
        """The server's θ_0..θ_{K−1} (built on first use: the seed is known in a step)."""
        if "clusters" not in state.extras:
            template = model_tensors(state.model)
            state.extras["clusters"] = initial_clusters(template, self.params.clusters, ctx.seed)
        return state.extras["clusters"]

    def broadcast(self, state, inbox, ctx):
        payload = pack(self.cluster_models(state, ctx))  # one payload, stored once for all
        return state, [Message(SERVER, client_name(i), TRAIN_KIND, payload) for i in ctx.sampled]

    def pick(self, state: State, inbox, ctx, stage: str) -> int:
        """Load the received model of lowest training loss into the client's model."""
        models = unpack(inbox[0].tensors)
        losses = cluster_losses(state, models)
        j = pick_cluster(losses)
        load_tensors(state.model, models[j])
        state.extras[CLUSTER] = j
        federation, k = ctx.federation, ctx.index
        ctx.record(
            "ifca_clusters",
            client=k,
            cluster=j,
            stage=stage,
            group=federation.groups[k] if federation.groups else 0,
            task=federation.tasks[k] if federation.tasks else 0,
            loss=losses[j],
        )
        return j

    def train(self, state, inbox, ctx):
        j = self.pick(state, inbox, ctx, "train")
        train_local_model(state, ctx, self.params)
        upload = {**model_tensors(state.model), CLUSTER: torch.tensor([j], dtype=torch.int64)}
        return state, [Message(ctx.me, SERVER, "model", upload)]

    def uplink_reference(self, message, inbox):
        """A client's update is taken against the cluster model it picked (the pick travels
        with it, uncompressed)."""
        if message.kind != "model" or not inbox:
            return None
        return unpack(inbox[0].tensors)[int(message.tensors[CLUSTER])]

    def aggregate(self, state, inbox, ctx):
        models, samples = self.cluster_models(state, ctx), ctx.federation.samples
        k = len(models)
        updates = []
        for message in by_sender(inbox):
            tensors = dict(message.tensors)
            j = int(tensors.pop(CLUSTER))
            if 0 <= j < k:
                updates.append((j, tensors, samples[index_of(message.src)]))
        for j, average in cluster_averages(updates, k, ctx, state, models).items():
            models[j] = average
        if not ctx.evaluated:  # the clients are not evaluated after this round: nothing to pick
            return state, []
        payload = pack(models)
        everyone = range(ctx.federation.num_clients)  # evaluated: counted (module docstring)
        return state, [Message(SERVER, client_name(i), EVAL_KIND, payload) for i in everyone]

    def choose(self, state, inbox, ctx):
        self.pick(state, inbox, ctx, "eval")
        return state, []
