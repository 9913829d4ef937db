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
server takes the average itself: FedAvg. The round, the clients' step and the messages are
FedAvg's, so FedAvgM subclasses it and changes only how the server takes the average in
(`merge`). The velocity v lives in the server's `State.extras`, so a checkpoint saves it and
`--resume` continues with it. Bits per round: FedAvg's (|S_t|·|w|·32 down and up); v never
leaves the server.
"""

from __future__ import annotations

import torch
from pydantic import Field

from raymtl.extend import (
    FedAvg,
    LocalTrainingParams,
    State,
    load_tensors,
    model_tensors,
    register_algorithm,
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
class FedAvgM(FedAvg):
    name = "fedavgm"
    summary = "FedAvgM: FedAvg with server momentum (Hsu et al. 2019)"
    Params = FedAvgMParams

    def merge(self, state: State, average: Tensors) -> None:
        """w, v ← server_momentum_step(w, a, v): the server's only change from FedAvg."""
        weights = model_tensors(state.model)
        velocity = state.extras.get("velocity")
        if velocity is None:  # round 1: v = 0
            velocity = {name: torch.zeros_like(w) for name, w in weights.items()}
        p = self.params
        weights, velocity = server_momentum_step(
            weights, average, velocity, p.server_momentum, p.server_lr
        )
        load_tensors(state.model, weights)
        state.extras["velocity"] = velocity
