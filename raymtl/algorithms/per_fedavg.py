"""Per-FedAvg — FedAvg whose local steps are MAML steps (personalisation baseline).

Fallah, Mokhtari and Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees:
A Model-Agnostic Meta-Learning Approach", NeurIPS 2020 (docs/ALGORITHMS.md, Per-FedAvg).

Objective: min_w (1/N)·Σ_i F_i(w), F_i(w) = f_i(w − α·∇f_i(w)): a shared start w that one
gradient step on a client's own data personalises. Round t, S_t the sampled clients:
    server:          sends w to every i ∈ S_t
    client i ∈ S_t:  w_i ← w; then τ times, on fresh batches D, D' (and D'' for HF):
                         w̃ ← w_i − α·∇f_i(w_i; D)
                         fo:  w_i ← w_i − β·∇f_i(w̃; D')
                         hf:  w_i ← w_i − β·(I − α·∇²f_i(w_i; D''))·∇f_i(w̃; D')
    server:          w ← Σ_{i∈S_t} n_i·w_i / Σ_{i∈S_t} n_i                       (FedAvg's)
HF's Hessian-vector product is exact, by double backward (∇_w ⟨∇f_i(w; D''), v⟩ with
v = ∇f_i(w̃; D') held fixed), where the paper estimates it by finite differences of two
gradients at w ± δ·v: the same quantity without the finite-difference error. f_i is the
loss of the client's task (cross-entropy on labels by default); float buffers (batch-norm
statistics) follow the forward passes. The task's optimiser, if it names one, is not used: the steps
are the paper's plain gradient steps.

Batches: D, D', D'' are consecutive mini-batches of B samples from seeded permutations of
the client's data (a new permutation when one runs out), seeded by (seed, round, client).
τ = `local_steps` (the paper's experiments: τ = 10); null: the steps E epochs of batches
make, ⌊E·⌈n_i/B⌉ / k⌋ (k = 2 batches a step for fo, 3 for hf), at least one.

Evaluation, as in the paper: a client is evaluated with w − α·∇f_i(w; D_i), one gradient step
from the global w it holds (the round's evaluation copy), on a batch D_i of B of its
training samples fixed per client (its support batch: seeded by the client's sample count
and B, the same every round), taken in evaluation mode (no dropout; batch-norm running
statistics), so that evaluating draws no randomness and never changes the kept state.

Defaults: τ = 10 local steps (the paper's experiments), α = 0.01 and β = 0.001 (as common
public implementations set them), variant fo; B = 32 and m = 1 as §2.
What travels: only w, as in FedAvg; a client keeps nothing (`keeps = ()`): the evaluation
copy of w is all its evaluation needs.
Bits per round: downlink |S_t|·|w|·32, uplink |S_t|·|w|·32 (FedAvg's).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from raymtl.algorithms.base import SERVER, Message, Params, State
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import derive_seed, load_received, model_tensors
from raymtl.tasks.objectives import task_loss

Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


class PerFedAvgParams(Params):
    variant: Literal["fo", "hf"] = Field(
        "fo", description="fo: first-order MAML step; hf: with the Hessian-vector product"
    )
    alpha: float = Field(0.01, gt=0, le=10, description="α, inner (adaptation) step size")
    beta: float = Field(0.001, gt=0, le=10, description="β, outer (meta) step size")
    local_steps: int | None = Field(
        10, ge=1, description="τ, MAML steps per round; null = as many as `epochs` of batches"
    )
    epochs: int = Field(1, ge=1, description="local epochs E (only when local_steps is null)")
    batch_size: int = Field(32, ge=1, description="B, samples in each of D, D', D''")
    sample_fraction: float = Field(
        1.0, gt=0, le=1, description="fraction m of clients sampled per round"
    )

    def batches_per_step(self) -> int:
        """D, D' (fo) or D, D', D'' (hf)."""
        return 2 if self.variant == "fo" else 3

    def steps(self, num_samples: int) -> int:
        """τ: `local_steps`, else the steps E epochs of batches make (at least one)."""
        if self.local_steps is not None:
            return self.local_steps
        batches = self.epochs * -(-num_samples // self.batch_size)
        return max(1, batches // self.batches_per_step())


def gradients(loss: torch.Tensor, params: list[torch.Tensor], create_graph: bool = False):
    """∇loss for every parameter (zeros for those the loss does not reach)."""
    if not loss.requires_grad:
        return [torch.zeros_like(p) for p in params]
    grads = torch.autograd.grad(loss, params, allow_unused=True, create_graph=create_graph)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


@torch.no_grad()
def descend(params: list[torch.Tensor], direction: list[torch.Tensor], lr: float) -> None:
    """θ ← θ − lr·direction, in place."""
    for p, d in zip(params, direction, strict=True):
        p.sub_(lr * d)


def maml_step(model: nn.Module, batches: list[Batch], p: PerFedAvgParams, loss_fn: LossFn):
    """One Per-FedAvg local step on `model` in place: `batches` is (D, D') for fo and
    (D, D', D'') for hf. Returns f(w̃; D'), the loss the step descends."""
    params = [q for q in model.parameters() if q.requires_grad]
    start = [q.detach().clone() for q in params]
    (x, y), (x_meta, y_meta) = batches[0], batches[1]
    descend(params, gradients(loss_fn(model, x, y), params), p.alpha)  # w̃ = w − α∇f(w; D)
    meta_loss = loss_fn(model, x_meta, y_meta)
    v = gradients(meta_loss, params)  # ∇f(w̃; D')
    with torch.no_grad():
        for q, w in zip(params, start, strict=True):
            q.copy_(w)  # back to w
    if p.variant == "hf":  # v ← (I − α·∇²f(w; D''))·v, the product by double backward
        x_h, y_h = batches[2]
        grad = gradients(loss_fn(model, x_h, y_h), params, create_graph=True)
        inner = sum((g * d).sum() for g, d in zip(grad, v, strict=True))
        hv = gradients(inner, params)
        v = [d - p.alpha * h for d, h in zip(v, hv, strict=True)]
    descend(params, v, p.beta)
    return float(meta_loss.detach())


def batch_stream(x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int) -> Iterator[Batch]:
    """Mini-batches of successive seeded permutations of (x, y), endlessly."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(y), generator=generator).to(y.device)
        for batch in order.split(batch_size):
            yield x[batch], y[batch]


def per_fedavg_train(model: nn.Module, data, p: PerFedAvgParams, seed: int) -> float:
    """τ MAML steps on the client's data in place; returns the mean f(w̃; D')."""
    loss_fn: LossFn = lambda net, x, y: task_loss(data.task, net(x), y)  # noqa: E731
    torch.manual_seed(seed)  # dropout draws
    stream = batch_stream(data.train_x, data.train_y, p.batch_size, seed)
    model.train()
    losses = []
    for _ in range(p.steps(len(data.train_y))):
        batches = [next(stream) for _ in range(p.batches_per_step())]
        losses.append(maml_step(model, batches, p, loss_fn))
    return sum(losses) / len(losses)


def support_batch(num_samples: int, batch_size: int) -> torch.Tensor:
    """The B training samples a client adapts on before it is evaluated: fixed per client
    (seeded by n_i and B), so an evaluation is the same wherever and whenever it runs."""
    generator = torch.Generator().manual_seed(derive_seed("per_fedavg", "support", num_samples))
    return torch.randperm(num_samples, generator=generator)[:batch_size]


def adapted_model(model: nn.Module, data, alpha: float, batch_size: int) -> nn.Module:
    """A copy of `model` after one step w − α·∇f(w; D_i) on the client's support batch."""
    adapted = copy.deepcopy(model)
    batch = support_batch(len(data.train_y), batch_size).to(data.train_y.device)
    adapted.eval()
    params = [q for q in adapted.parameters() if q.requires_grad]
    with torch.enable_grad():
        loss = task_loss(data.task, adapted(data.train_x[batch]), data.train_y[batch])
        descend(params, gradients(loss, params), alpha)
    return adapted


@register_algorithm
class PerFedAvg(FedAvg):
    """FedAvg's round (broadcast → train → aggregate) with MAML local steps."""

    name = "per_fedavg"
    summary = "Per-FedAvg: FedAvg of MAML local steps, evaluated after one adaptation step"
    Params = PerFedAvgParams
    shapes = ("star",)
    keeps = ()  # w arrives with each round; the evaluation copy is all evaluation needs

    def train(self, state, inbox, ctx):
        load_received(state.model, inbox)  # w_i ← w
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
        state.extras["train_loss"] = per_fedavg_train(state.model, state.data, self.params, seed)
        return state, [Message(ctx.me, SERVER, "model", model_tensors(state.model))]

    def eval_model(self, state: State) -> nn.Module:
        """w − α·∇f_i(w; D_i) from the global w the client holds (the kept state unchanged)."""
        if state.data is None or len(state.data.train_y) == 0:
            return state.model
        return adapted_model(state.model, state.data, self.params.alpha, self.params.batch_size)
