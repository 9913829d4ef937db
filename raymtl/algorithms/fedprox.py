"""FedProx — FedAvg with a proximal term in the local objective, and partial work kept.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in Heterogeneous
Networks", MLSys 2020 (docs/ALGORITHMS.md, FedProx).

Round t, with S_t the sampled clients (⌈m·N⌉ of N) and w^t the global model:
    server:          sends w^t to every k ∈ S_t
    client k ∈ S_t:  w_k ← SGD on h_k(w) = f_k(w) + μ/2·‖w − w^t‖², from w = w^t,
                     i.e. per batch  w ← w − η·(∇f_k(w) + μ·(w − w^t)),
                     for E epochs (T_k = E·⌈n_k / B⌉ steps), or s_k steps for a straggler
    server:          w^{t+1} ← Σ_{k∈S_t} n_k·w_k / Σ_{k∈S_t} n_k   (stragglers included)
Stragglers (systems heterogeneity, `straggler_fraction` x): ⌊x·|S_t| + ½⌋ of the sampled
clients, drawn per round from a seed of (seed, t); each runs only s_k ~ U{1, …, T_k − 1}
local steps (seeded by (seed, t, k); s_k = 1 when T_k = 1): the first s_k steps of its
E-epoch schedule. FedProx averages their partial updates (FedAvg would drop them).
‖·‖ runs over the model's parameters (float buffers travel but have no gradient). μ = 0 and
x = 0 is FedAvg exactly. Every client is evaluated with w^{t+1} (not traffic).
Bits per round: FedAvg's, downlink |S_t|·|w|·32, uplink |S_t|·|w|·32 (a straggler sends a
whole model too). A client keeps nothing between rounds (`keeps = ()`).
FedAvg's `local_layers` and `epochs_max` apply (fedavg.py): T_k then counts the client's
drawn epochs, and the local layers' proximal anchor is the client's own start of the round.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from pydantic import Field
from torch import nn

from raymtl.algorithms.base import SERVER, LocalTrainingParams, Message, State, StepContext
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.local_layers import WholeModelParams
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import LocalRun, derive_seed, load_received, local_sgd
from raymtl.tasks.objectives import task_loss


class FedProxParams(WholeModelParams):
    mu: float = Field(
        0.01, ge=0, le=100, description="proximal weight μ (paper: 0.001, 0.01, 0.1, 1)"
    )
    straggler_fraction: float = Field(
        0.0, ge=0, le=1, description="share x of sampled clients that do partial work"
    )


def proximal_term(model: nn.Module, anchor: dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    """μ/2·Σ_p ‖p − anchor_p‖² over the model's parameters (its gradient is μ·(w − w^t))."""
    squares = [((p - anchor[name]) ** 2).sum() for name, p in model.named_parameters()]
    return 0.5 * mu * torch.stack(squares).sum()


def stragglers(ctx: StepContext, fraction: float) -> frozenset[int]:
    """The round's stragglers: ⌊x·|S_t| + ½⌋ of S_t, the same draw on every host (it depends
    on (seed, round) only, as if the server chose them)."""
    sampled = sorted(ctx.sampled)
    count = math.floor(Fraction(repr(float(fraction))) * len(sampled) + Fraction(1, 2))
    if count == 0:
        return frozenset()
    generator = torch.Generator().manual_seed(derive_seed(ctx.seed, ctx.round, SERVER, "straggle"))
    order = torch.randperm(len(sampled), generator=generator)[:count]
    return frozenset(sampled[int(i)] for i in order)


def full_steps(samples: int, params: LocalTrainingParams) -> int:
    """T_k = E·⌈n_k / B⌉: the local steps of a full round of work."""
    return params.epochs * math.ceil(samples / params.batch_size)


def straggler_steps(ctx: StepContext, total: int) -> int:
    """s_k ~ U{1, …, T_k − 1}, seeded by (seed, round, client); 1 when T_k = 1."""
    generator = torch.Generator().manual_seed(derive_seed(ctx.seed, ctx.round, ctx.me, "steps"))
    return int(torch.randint(1, max(total, 2), (1,), generator=generator))


def fedprox_sgd(
    model: nn.Module, data, params: FedProxParams, seed: int, max_steps: int | None = None
) -> LocalRun:
    """Local SGD on f_k(w) + μ/2·‖w − w^t‖², w^t the model's weights on entry, in place.

    `local_sgd`'s schedule (batch order, optimiser, clipping) with the proximal term added
    through its loss hook; `max_steps` stops after that many steps of the schedule. Returns
    the mean task loss f_k over the steps run (without the proximal term) and their number.
    """
    anchor = {name: p.detach().clone() for name, p in model.named_parameters()}
    task_losses: list[torch.Tensor] = []

    def loss_fn(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = task_loss(data.task, net(x), y)
        task_losses.append(loss.detach())
        return loss + proximal_term(net, anchor, params.mu)

    x, y = data.train_x, data.train_y
    local_sgd(model, x, y, params, seed, loss_fn=loss_fn, task=data.task, max_steps=max_steps)
    mean = float(torch.stack(task_losses).mean()) if task_losses else float("nan")
    return LocalRun(mean, len(task_losses))


@register_algorithm
class FedProx(FedAvg):
    """FedAvg's round (broadcast → train → aggregate) with FedProx's local solver."""

    name = "fedprox"
    summary = "FedProx: FedAvg with a proximal local objective and partial work (Li et al. 2020)"
    Params = FedProxParams
    shapes = ("star",)
    keeps = ()  # w^t arrives with each round

    def train(self, state: State, inbox: list[Message], ctx: StepContext):
        load_received(state.model, inbox)  # w ← w^t, the proximal anchor
        params, samples = self.local_params(ctx), len(state.data.train_y)
        straggler = ctx.index in stragglers(ctx, params.straggler_fraction)
        budget = straggler_steps(ctx, full_steps(samples, params)) if straggler else None
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
        loss, steps = fedprox_sgd(state.model, state.data, params, seed, budget)
        state.extras["train_loss"] = loss
        if params.straggler_fraction > 0:
            ctx.record("fedprox_work", client=ctx.index, straggler=straggler, steps=steps)
        return state, [Message(ctx.me, SERVER, "model", self.shared(state.model))]
