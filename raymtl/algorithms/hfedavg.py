"""Hierarchical FedAvg — one global parameter server (GPS) over T local ones (LPS).

Liu et al., "Client-Edge-Cloud Hierarchical Federated Learning", ICC 2020; the
multi-task variant of the one-shot clustering paper (papers/oneshot_clustering_hfl.md)
shares only the `common` layers globally.

Round t, users U_k assigned to LPS k:
    user i:   w_i ← LocalSGD(w_k, E epochs, lr)                       (sends w_i to LPS k)
    LPS k:    w_k ← Σ_{i∈U_k} n_i·w_i / Σ_{i∈U_k} n_i                 (whole model)
    if t mod global_every = 0:
      GPS:    c ← Σ_k N_k·c_k / Σ_k N_k,  N_k = Σ_{i∈U_k} n_i         (common layers c only)
      LPS k:  c_k ← c
    LPS k sends w_k to its users.
"""

from __future__ import annotations

from pydantic import Field

from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    State,
    client_name,
    index_of,
    lps_name,
    role_of,
)
from raymtl.algorithms.fedavg import by_sender, train_local_model
from raymtl.algorithms.registry import register
from raymtl.algorithms.training import load_tensors, model_tensors, weighted_average


class HFedAvgParams(LocalTrainingParams):
    global_every: int = Field(1, ge=1, description="GPS aggregation every this many rounds")
    common_prefixes: tuple[str, ...] | None = Field(
        None,
        description="parameter-name prefixes averaged by the GPS; null = the model's "
        "own common layers (a CNN's convolutions, the MLP's first layer)",
    )


def lps_samples(federation, lps: int) -> int:
    """N_k: train samples held by the users of LPS k."""
    return sum(federation.samples[i] for i in federation.clients_of_lps(lps))


@register
class HFedAvg(Algorithm):
    name = "hfedavg"
    summary = "Hierarchical FedAvg: LPSs average their users, the GPS averages common layers"
    Params = HFedAvgParams
    shapes = ("hierarchical",)

    def phases(self, round_index, rounds):
        phases = [Phase("client", "train", "all"), Phase("lps", "aggregate", "inbox")]
        if round_index % self.params.global_every == 0:
            phases.append(Phase("server", "aggregate_common", "inbox"))
        return phases + [Phase("lps", "broadcast", "all"), Phase("client", "receive", "inbox")]

    def init_state(self, participant, data, federation):
        if role_of(participant) == "lps":
            users = federation.clients_of_lps(index_of(participant))
            classes = {federation.num_classes[i] for i in users} or {federation.num_classes[0]}
            if len(classes) > 1:
                raise ValueError(
                    f"topology.num_lps: {participant} mixes tasks with {sorted(classes)} classes"
                )
            return State(model=self.model_factory(classes.pop()))
        return super().init_state(participant, data, federation)

    def common_prefixes(self, model) -> tuple[str, ...]:
        if self.params.common_prefixes is not None:
            return tuple(self.params.common_prefixes)
        return tuple(model.common_prefixes())

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        lps = lps_name(ctx.federation.lps_of_client[ctx.index])
        return state, [Message(ctx.me, lps, "model", model_tensors(state.model))]

    def aggregate(self, state, inbox, ctx):
        samples = ctx.federation.samples
        average = weighted_average(
            [(m.tensors, samples[index_of(m.src)]) for m in by_sender(inbox)]
        )
        if average is not None:
            load_tensors(state.model, average)
        if ctx.round % self.params.global_every != 0:
            return state, []
        common = model_tensors(state.model, self.common_prefixes(state.model))
        return state, [Message(ctx.me, SERVER, "common", common)]

    def aggregate_common(self, state, inbox, ctx):
        fed = ctx.federation
        average = weighted_average(
            [(m.tensors, lps_samples(fed, index_of(m.src))) for m in by_sender(inbox)]
        )
        if average is None:
            return state, []
        return state, [Message(SERVER, m.src, "common", average) for m in by_sender(inbox)]

    def broadcast(self, state, inbox, ctx):
        for message in inbox:
            load_tensors(state.model, message.tensors)
        tensors = model_tensors(state.model)
        users = ctx.federation.clients_of_lps(ctx.index)
        return state, [Message(ctx.me, client_name(i), "lps_model", tensors) for i in users]

    def receive(self, state, inbox, ctx):
        for message in inbox:
            load_tensors(state.model, message.tensors)
        return state, []
