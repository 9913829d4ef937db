"""Ditto — FedAvg's global model plus a proximal personal model per client (baseline).

Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021 (docs/ALGORITHMS.md, Ditto).

Round t, with S_t the sampled clients (⌈m·N⌉ of N):
    server:          sends w to every k ∈ S_t
    client k ∈ S_t:  w_k ← LocalSGD(w, E epochs, η)                               (FedAvg's)
                     E_p epochs of mini-batch SGD on the client's data, from its kept v_k:
                         v_k ← v_k − η_p·(∇f_k(v_k) + λ·(v_k − w))
                     with w the global model received this round (before local training)
    server:          w ← Σ_{k∈S_t} n_k·w_k / Σ_{k∈S_t} n_k                       (FedAvg's)
The personal step is LocalSGD on f_k(v) + λ/2·‖v − w‖² (the parameters; float buffers such
as batch-norm statistics follow v's own forward passes). Before its first training a client's
v_k is the global w it receives then. A client is evaluated with its v_k (before any
training: with the global w it holds), and keeps v_k between rounds (`keeps = ("extras",)`);
the global w arrives with every round.

Defaults (the paper's): λ = 0.1, η_p = η, E_p = E. The global part trains with the seed
FedAvg uses, so w follows FedAvg's trajectory exactly; v_k has its own seed.
What travels: only w, as in FedAvg; v_k never leaves its client. FedAvg's `local_layers`
apply to w (fedavg.py); under `epochs_max` the drawn epochs are w's, v_k keeps E_p.
Bits per round: downlink |S_t|·|w|·32, uplink |S_t|·|w|·32 (FedAvg's).
"""

from __future__ import annotations

import copy

import torch
from pydantic import Field
from torch import nn

from raymtl.algorithms.base import SERVER, LocalTrainingParams, Message, State
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.local_layers import WholeModelParams
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import (
    derive_seed,
    load_received,
    load_tensors,
    local_sgd,
    model_tensors,
    train_local_model,
)
from raymtl.tasks.objectives import task_loss


class DittoParams(WholeModelParams):
    lam: float = Field(
        0.1, ge=0, le=1e4, description="λ, pull of the personal model towards w (0: local)"
    )
    personal_lr: float | None = Field(
        None, gt=0, description="η_p, personal-model learning rate; null = lr"
    )
    personal_epochs: int | None = Field(
        None, ge=1, description="E_p, personal epochs per round; null = epochs"
    )

    def personal(self) -> LocalTrainingParams:
        """The local SGD settings of the personal step (η_p, E_p; the rest as for w)."""
        return LocalTrainingParams(
            **{
                **self.model_dump(include=set(LocalTrainingParams.model_fields)),
                "lr": self.personal_lr if self.personal_lr is not None else self.lr,
                "epochs": self.personal_epochs or self.epochs,
            }
        )


def proximal_term(model: nn.Module, anchor: dict[str, torch.Tensor], lam: float) -> torch.Tensor:
    """λ/2·‖v − w‖² over the model's parameters (its gradient is λ·(v − w))."""
    squares = [((v - anchor[name]) ** 2).sum() for name, v in model.named_parameters()]
    return 0.5 * lam * torch.stack(squares).sum()


def personal_step(
    personal: nn.Module, global_model: nn.Module, data, params: DittoParams, seed: int
) -> float:
    """E_p epochs of v ← v − η_p·(∇f(v) + λ·(v − w)) on `data`, in place; w is
    `global_model` as it is now (left untouched). Returns the mean batch loss f + prox."""
    anchor = {name: w.detach().clone() for name, w in global_model.named_parameters()}

    def loss(net, x, y):
        return task_loss(data.task, net(x), y) + proximal_term(net, anchor, params.lam)

    return local_sgd(
        personal, data.train_x, data.train_y, params.personal(), seed, loss, task=data.task
    ).loss


@register_algorithm
class Ditto(FedAvg):
    """FedAvg's round (broadcast → train → aggregate); the client also trains its v_k."""

    name = "ditto"
    summary = "Ditto: FedAvg's global model + a personal model pulled towards it (Li et al. 2021)"
    Params = DittoParams
    shapes = ("star",)
    keeps = ("extras",)  # v_k; w arrives with each round

    def eval_model(self, state: State) -> nn.Module:
        if "personal" not in state.extras:
            return state.model  # never trained: the global w it received
        # v_k is kept as tensors (checkpoints hold tensors only, never a pickled module).
        personal = copy.deepcopy(state.model)
        load_tensors(personal, state.extras["personal"])
        return personal

    def train(self, state, inbox, ctx):
        load_received(state.model, inbox)  # w, this round's global model
        personal = copy.deepcopy(state.model)  # v_k ← w before the client's first training
        if "personal" in state.extras:
            load_tensors(personal, state.extras["personal"])
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "personal")
        state.extras["personal_loss"] = personal_step(
            personal, state.model, state.data, self.params, seed
        )
        state.extras["personal"] = model_tensors(personal)
        # w_k ← LocalSGD(w), FedAvg's seed and (under epochs_max) FedAvg's drawn epochs
        train_local_model(state, ctx, self.local_params(ctx))
        return state, [Message(ctx.me, SERVER, "model", self.shared(state.model))]
