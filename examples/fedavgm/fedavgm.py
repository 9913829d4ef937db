"""FedAvgM: FedAvg with server momentum (Hsu, Qi and Brown, "Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification", 2019).

A raymtl plugin: name this file in an experiment's `plugins:` list and use
`algorithm.name: fedavgm`. It imports nothing but the public `raymtl.extend`.

Round t, with S_t the sampled clients and n_i client i's training samples:
    server:          sends w to every i ∈ S_t
    client i ∈ S_t:  w_i ← LocalSGD(w, E epochs, lr)
    server:          a = Σ_{i∈S_t} n_i·w_i / Σ_{i∈S_t} n_i       (FedAvg's average)
                     Δ = w − a                                    (the pseudo-gradient)
                     v ← β·v + Δ                                  (v = 0 before round 1)
                     w ← w − η_s·v
Defaults β = 0.9 (server_momentum), η_s = 1.0 (server_lr). With β = 0 and η_s = 1 the
server takes the average itself: FedAvg. The velocity v lives in the server's
`State.extras`, so a checkpoint saves it and `--resume` continues with it.
Bits per round: FedAvg's (|S_t|·|w|·32 down and up); v never leaves the server.
"""

from __future__ import annotations

import torch
from pydantic import Field

from raymtl.extend import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    State,
    by_sender,
    client_name,
    load_received,
    load_tensors,
    model_tensors,
    register_algorithm,
    train_local_model,
    weighted_average,
)

Tensors = dict[str, torch.Tensor]


class FedAvgMParams(LocalTrainingParams):
    """FedAvg's local training plus the server's optimiser."""

    server_lr: float = Field(1.0, gt=0, le=10, description="server learning rate η_s")
    server_momentum: float = Field(0.9, ge=0, lt=1, description="server momentum β")


def server_momentum_step(
    weights: Tensors, average: Tensors, velocity: Tensors, momentum: float, lr: float
) -> tuple[Tensors, Tensors]:
    """One server step: (w, a, v) -> (w − η_s·v', v') with v' = β·v + (w − a).

    w − η_s·v' is computed as (1 − η_s)·w + η_s·a − η_s·β·v (equal in exact arithmetic), so
    that β = 0, η_s = 1 returns the average bit for bit, as FedAvg does.
    """
    new_weights, new_velocity = {}, {}
    for name, w in weights.items():
        a, v = average[name], velocity[name]
        new_velocity[name] = momentum * v + (w - a)
        new_weights[name] = (1 - lr) * w + lr * a - (lr * momentum) * v
    return new_weights, new_velocity


@register_algorithm
class FedAvgM(Algorithm):
    name = "fedavgm"
    summary = "FedAvgM: FedAvg with server momentum (Hsu et al. 2019)"
    Params = FedAvgMParams
    shapes = ("star",)
    keeps = ()  # a client's model arrives with each round: nothing of it persists

    def phases(self, round_index, rounds):
        return [
            Phase("server", "broadcast", "all"),
            Phase("client", "train", "sampled"),
            Phase("server", "aggregate", "inbox"),
        ]

    def init_state(self, participant, data, federation):
        if participant == SERVER:
            return State(model=self.model_factory(participant, federation.num_classes[0]))
        return super().init_state(participant, data, federation)

    def broadcast(self, state, inbox, ctx):
        global_model = model_tensors(state.model)  # one payload, stored once for all
        return state, [
            Message(SERVER, client_name(i), "global_model", global_model) for i in ctx.sampled
        ]

    def train(self, state, inbox, ctx):
        load_received(state.model, inbox)  # this round's global model w
        train_local_model(state, ctx, self.params)
        return state, [Message(ctx.me, SERVER, "model", model_tensors(state.model))]

    def aggregate(self, state, inbox, ctx):
        samples = {client_name(i): n for i, n in enumerate(ctx.federation.samples)}
        # Sorted by sender: the float sums do not depend on the order messages arrived in.
        average = weighted_average([(m.tensors, samples[m.src]) for m in by_sender(inbox)])
        if average is not None:  # None: every update was non-finite; keep w and v
            weights = model_tensors(state.model)
            velocity = state.extras.get("velocity")
            if velocity is None:
                velocity = {name: torch.zeros_like(w) for name, w in weights.items()}
            p = self.params
            weights, velocity = server_momentum_step(
                weights, average, velocity, p.server_momentum, p.server_lr
            )
            load_tensors(state.model, weights)
            state.extras["velocity"] = velocity
        global_model = model_tensors(state.model)
        # Every client is evaluated with the new model: evaluation_only, so not traffic.
        return state, [
            Message(SERVER, client_name(i), "global_model", global_model, evaluation_only=True)
            for i in range(ctx.federation.num_clients)
        ]
