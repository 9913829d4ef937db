"""Hierarchical FedAvg — one global parameter server (GPS) over T local ones (LPS).

Liu et al., "Client-Edge-Cloud Hierarchical Federated Learning", ICC 2020; the
multi-task variant of Ali & Arafa's one-shot clustering paper shares only the `common`
layers globally (docs/ALGORITHMS.md §16).

Round t, users U_k assigned to LPS k:
    user i:   w_i ← LocalSGD(w_k, E epochs, lr)                       (sends w_i to LPS k)
    LPS k:    w_k ← Σ_{i∈U_k} n_i·w_i / Σ_{i∈U_k} n_i                 (whole model)
    if t mod global_every = 0:
      GPS:    c ← Σ_k N_k·c_k / Σ_k N_k,  N_k = Σ_{i∈U_k} n_i         (common layers c only)
      LPS k:  c_k ← c
    LPS k sends w_k to its users.
Users of different tasks may share an LPS: their task layers are averaged only among users
of the same kind of task, the common layers among all (algorithms/hierarchy.py).
"""

from __future__ import annotations

from pydantic import Field

from raymtl.algorithms.aggregate import by_sender, combine
from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    index_of,
    lps_name,
)
from raymtl.algorithms.hierarchy import (
    CommonLayers,
    common_of,
    lps_broadcast,
    shape_average,
    signature,
)
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import load_received, model_tensors, train_local_model


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


@register_algorithm
class HFedAvg(CommonLayers, Algorithm):
    name = "hfedavg"
    toolbox = ("aggregation", "uplink")  # LPS and GPS means; DP and optimisers: star only
    toolbox_refusals = {
        "privacy": "central DP is a server's over its sampled clients; here LPSs sum their users",
        "server_optimizer": "the GPS merges common layers into LPSs, not a model of its own",
    }
    summary = "Hierarchical FedAvg: LPSs average their users, the GPS averages common layers"
    Params = HFedAvgParams
    shapes = ("hierarchical",)
    task_support = "different"

    def phases(self, round_index, rounds):
        phases = [Phase("client", "train", "all", trains=True), Phase("lps", "aggregate", "inbox")]
        if round_index % self.params.global_every == 0:
            phases.append(Phase("server", "aggregate_common", "inbox"))
        return phases + [Phase("lps", "broadcast", "all"), Phase("client", "receive", "inbox")]

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        lps = lps_name(ctx.federation.lps_of_client[ctx.index])
        return state, [Message(ctx.me, lps, "model", model_tensors(state.model))]

    def aggregate(self, state, inbox, ctx):
        fed, common = ctx.federation, self.common_prefixes()
        kinds = fed.task_kinds()  # task layers mix only among users of one kind of task
        models = by_sender(inbox)
        keys = {
            index_of(m.src): signature(m.tensors, kinds[index_of(m.src)], common) for m in models
        }
        updates = [(m.tensors, fed.samples[index_of(m.src)], keys[index_of(m.src)]) for m in models]
        state.extras["model"], state.extras["keys"] = shape_average(updates, ctx), keys
        if ctx.round % self.params.global_every != 0 or not models:
            return state, []
        shared = common_of(state.extras["model"], common, ctx.me)
        return state, [Message(ctx.me, SERVER, "common", shared)]

    def aggregate_common(self, state, inbox, ctx):
        fed = ctx.federation
        average = combine(
            [(m.tensors, lps_samples(fed, index_of(m.src))) for m in by_sender(inbox)], ctx
        )
        if average is None:
            return state, []
        return state, [Message(SERVER, m.src, "common", average) for m in by_sender(inbox)]

    def broadcast(self, state, inbox, ctx):
        keys = state.extras.get("keys", {})
        return state, lps_broadcast(state, inbox, keys, ctx.me)

    def receive(self, state, inbox, ctx):
        load_received(state.model, inbox)
        return state, []
