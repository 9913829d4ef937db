"""pFedMe — personalised FL with Moreau envelopes (baseline).

Dinh, Tran and Nguyen, "Personalized Federated Learning with Moreau Envelopes",
NeurIPS 2020 (docs/ALGORITHMS.md §8).

Round t, sampled client k starts from the global w (w_k ← w, θ̃ ← w); for every batch D:
    K times:  θ̃ ← θ̃ − η_p·(∇f(θ̃; D) + λ·(θ̃ − w_k))
    then:     w_k ← w_k − η·λ·(w_k − θ̃)
Server:       w ← (1−β)·w_prev + β·Σ_{k∈S_t} (n_k / Σ_{j∈S_t} n_j)·w_k, broadcast to all.
Personalised accuracy is measured with the personal model θ̃ of the client's last training
(before its first training: the model it holds). FedAvg's `local_layers` and `epochs_max`
apply (fedavg.py): the local layers never travel, E_k epochs of batches under epochs_max.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from raymtl.algorithms.base import SERVER, Message
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.local_layers import WholeModelParams
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import derive_seed, load_received, load_tensors, model_tensors


class PFedMeParams(WholeModelParams):
    lr: float = Field(0.01, gt=0, description="local-copy learning rate η")
    personal_lr: float = Field(0.01, gt=0, description="personal-model learning rate η_p")
    lam: float = Field(15.0, gt=0, description="Moreau-envelope regularisation λ")
    beta: float = Field(1.0, gt=0, le=2, description="server mixing β (1 = plain averaging)")
    inner_steps: int = Field(5, ge=1, description="K personal steps per batch")

    @model_validator(mode="after")
    def _plain_steps_only(self):
        if self.momentum or self.weight_decay:
            raise ValueError("momentum and weight_decay are not part of pFedMe's update: use 0")
        return self


@torch.no_grad()
def moreau_step(personal: nn.Module, local: nn.Module, lr_p: float, lam: float) -> None:
    """θ̃ ← θ̃ − η_p·(∇f(θ̃) + λ·(θ̃ − w)), gradients already in θ̃.grad."""
    for theta, w in zip(personal.parameters(), local.parameters(), strict=True):
        grad = theta.grad if theta.grad is not None else torch.zeros_like(theta)
        theta.sub_(lr_p * (grad + lam * (theta - w)))


@torch.no_grad()
def local_copy_step(local: nn.Module, personal: nn.Module, lr: float, lam: float) -> None:
    """w ← w − η·λ·(w − θ̃)."""
    for w, theta in zip(local.parameters(), personal.parameters(), strict=True):
        w.sub_(lr * lam * (w - theta))


def pfedme_batch(local, personal, x, y, params: PFedMeParams) -> float:
    """K personal steps on one batch, then the local-copy step; returns the last loss."""
    loss = torch.zeros(())
    for _ in range(params.inner_steps):
        personal.zero_grad(set_to_none=True)
        loss = F.cross_entropy(personal(x), y)
        loss.backward()
        if params.clip_grad is not None:
            nn.utils.clip_grad_norm_(personal.parameters(), params.clip_grad)
        moreau_step(personal, local, params.personal_lr, params.lam)
    local_copy_step(local, personal, params.lr, params.lam)
    return float(loss.detach())


def pfedme_train(local: nn.Module, data, params: PFedMeParams, seed: int) -> nn.Module:
    """One round of pFedMe on the client; returns the personal model θ̃ (w updated in place)."""
    torch.manual_seed(seed)  # dropout draws
    order_rng = torch.Generator().manual_seed(seed)
    personal = copy.deepcopy(local)
    personal.train()
    local.train()
    for _ in range(params.epochs):
        order = torch.randperm(len(data.train_y), generator=order_rng)
        for batch in order.split(params.batch_size):
            batch = batch.to(data.train_y.device)
            pfedme_batch(local, personal, data.train_x[batch], data.train_y[batch], params)
    personal.zero_grad(set_to_none=True)
    return personal


@register_algorithm
class PFedMe(FedAvg):
    """FedAvg's round (broadcast → train → aggregate) with pFedMe's client and server steps."""

    name = "pfedme"
    toolbox = ("aggregation", "privacy", "uplink")  # its merge is its own β-step: no optimiser
    toolbox_refusals = {"server_optimizer": "its server step is its own β-mix of w and the mean"}
    summary = "pFedMe: Moreau-envelope personal models, FedAvg of the local copies"
    Params = PFedMeParams
    shapes = ("star",)
    task_support = "labels"  # the update uses class labels (cross-entropy)
    keeps = ("extras",)  # θ̃; w_k ← w arrives with each round

    def eval_model(self, state):
        if "personal" not in state.extras:
            return state.model
        # θ̃ is kept as tensors (checkpoints hold tensors only, never a pickled module).
        personal = copy.deepcopy(state.model)
        load_tensors(personal, state.extras["personal"])
        return personal

    def train(self, state, inbox, ctx):
        load_received(state.model, inbox)  # w_k ← w
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
        personal = pfedme_train(state.model, state.data, self.local_params(ctx), seed)
        state.extras["personal"] = model_tensors(personal)
        return state, [Message(ctx.me, SERVER, "model", self.shared(state.model))]

    def merge(self, state, average) -> None:
        """w ← (1−β)·w_prev + β·Σ_k (n_k/n)·w_k."""
        beta, previous = self.params.beta, model_tensors(state.model)
        mixed = {k: (1 - beta) * previous[k] + beta * v for k, v in average.items()}
        load_tensors(state.model, mixed)
