"""FedNova — FedAvg with each client's update normalised by its amount of local work.

Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020 (docs/ALGORITHMS.md, FedNova).

Client k runs τ_k local steps from the global w_t (τ_k = E_k·⌈n_k/B⌉ differs across clients
when their sample counts or epochs differ: `epochs_max` draws E_k per client and round). Its
update is w_t − w_k = η·Σ_s a_{k,s}·g_{k,s}, and ‖a_k‖₁ measures how far τ_k steps carry it:
    plain SGD:                   ‖a_k‖₁ = τ_k
    SGD with momentum ρ:         ‖a_k‖₁ = [τ_k − ρ(1 − ρ^{τ_k})/(1 − ρ)]/(1 − ρ)
    proximal term μ (FedProx):   ‖a_k‖₁ = [1 − (1 − η·μ)^{τ_k}]/(η·μ)
(a constant learning rate η and a momentum buffer reset every round, torch.optim.SGD's
convention). Round t, with S_t the sampled clients:
    server:          sends w_t to every k ∈ S_t
    client k ∈ S_t:  w_k ← LocalSGD(w_t) (with μ: on f_k(w) + μ/2·‖w − w_t‖², as FedProx)
                     sends w_k and ‖a_k‖₁
    server:          d_k = (w_t − w_k)/‖a_k‖₁;  p_k = n_k / Σ_{j∈S_t} n_j
                     τ_eff = Σ_k p_k·‖a_k‖₁
                     w_{t+1} = w_t − τ_eff·Σ_k p_k·d_k
Equal τ_k (so equal ‖a_k‖₁) give τ_eff = ‖a_k‖₁ and FedAvg's average exactly.

Composition with the toolbox (docs/ALGORITHMS.md §9): the server builds, per client, the
normalised model x_k = w_t − τ_eff·d_k and hands the x_k to the experiment's aggregation rule
(`combine`, reference w_t): the default mean by samples is Σ p_k·x_k = the formula above;
`weights: uniform` (and central DP, whose mean is uniform) take p_k = 1/m_t in τ_eff and the
mean alike; another rule (median, trimmed mean, Krum) combines the x_k with τ_eff from the
`weights` setting. Then the server optimiser steps on Δ_t = combined − w_t. Central DP clips
the normalised updates x_k − w_t: the clip is the last operation before the noisy sum.

What travels: w_k as the message "model" (the uplink that compression and attacks act on)
and ‖a_k‖₁ as a second message "norm_a", one float64 (64 bits), never compressed: it
depends only on τ_k and the client's learning rate, momentum and μ. Bits per round: FedAvg's
plus |S_t|·64 up. ‖a_k‖₁ is computed in float64 as positive sums (no cancellation near
ρ = 1). Each trained client reports τ_k, ‖a_k‖₁ and E_k (`ctx.report`: step_metrics).
Momentum with μ > 0 has no formula here and is refused; so is a task optimiser other than
SGD. A client keeps nothing between rounds (`keeps = ()`) unless `local_layers` is set.
"""

from __future__ import annotations

import logging
import math
from fractions import Fraction

import torch
from pydantic import Field, model_validator

from raymtl.algorithms.aggregate import by_sender, is_finite
from raymtl.algorithms.base import (
    SERVER,
    FederationInfo,
    Message,
    State,
    StepContext,
    index_of,
)
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.fedprox import fedprox_sgd
from raymtl.algorithms.local_layers import WholeModelParams
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import (
    derive_seed,
    load_received,
    params_optimizer,
    train_local_model,
)
from raymtl.toolbox.settings import Toolbox

log = logging.getLogger(__name__)

Tensors = dict[str, torch.Tensor]
NORM_A = "norm_a"  # the kind of the message that carries ‖a_k‖₁, and its tensor's name


class FedNovaParams(WholeModelParams):
    mu: float = Field(
        0.0, ge=0, le=100, description="FedProx's proximal weight μ of the local solver (0: SGD)"
    )

    @model_validator(mode="after")
    def _one_formula(self) -> FedNovaParams:
        if self.mu and self.momentum:
            raise ValueError(
                "mu: FedNova's ‖a_k‖₁ is known for momentum or a proximal term, not both "
                "(set momentum: 0 or mu: 0)"
            )
        return self


def normalising_norm(steps: int, lr: float, momentum: float = 0.0, mu: float = 0.0) -> float:
    """‖a_k‖₁ after `steps` local steps of SGD with learning rate `lr`, `momentum` ρ and a
    proximal weight `mu` (not both), in float64 (module docstring). As positive sums:
    momentum Σ_{i<τ} (τ − i)·ρ^i, proximal Σ_{i<τ} (1 − η·μ)^i for η·μ ≤ 1."""
    if steps <= 0:
        return 0.0
    if momentum and mu:
        raise ValueError("FedNova's ‖a_k‖₁: momentum and a proximal term together")
    if momentum:
        return math.fsum((steps - i) * momentum**i for i in range(steps))
    if mu:
        rate = lr * mu
        if rate <= 1:  # 1 − (1 − rate)^τ without cancelling: −expm1(τ·log1p(−rate))
            return -math.expm1(steps * math.log1p(-rate)) / rate if rate < 1 else 1.0
        return (1 - (1 - rate) ** steps) / rate  # steps that overshoot: the formula as it is
    return float(steps)


def uniform_weights(toolbox: Toolbox) -> bool:
    """Whether the server's combination weighs the clients equally (p_k = 1/m_t): the
    `uniform` weights setting, or central DP (its mean is uniform, §9.3)."""
    privacy = toolbox.privacy
    return toolbox.aggregation.weights == "uniform" or (
        privacy.client_level and privacy.noise != "local"
    )


def normalised_models(
    reference: Tensors, clients: list[tuple[Tensors, float, float]]
) -> tuple[list[tuple[Tensors, float]], float]:
    """FedNova's x_k = w_t − τ_eff·d_k = w_t + (τ_eff/‖a_k‖₁)·(w_k − w_t) for every client
    (w_k, ‖a_k‖₁, p_k-weight), in the order given, with τ_eff = Σ p_k·‖a_k‖₁ (the weights
    normalised); returns [(x_k, weight)] and τ_eff.

    τ_eff is the exact rational Σ w_k·‖a_k‖₁ / Σ w_k rounded once, so that equal ‖a_k‖₁ give
    τ_eff = ‖a_k‖₁ and a scale of exactly 1: then x_k is w_k itself (FedAvg bit for bit).
    Otherwise x_k is computed in float64 and rounded once to the model's dtype. A client that
    ran no step (‖a_k‖₁ = 0) has w_k = w_t and d_k = 0: x_k = w_t.
    """
    total = sum(Fraction(weight) for _, _, weight in clients)
    if total <= 0:
        return [], 0.0
    tau_eff = float(sum(Fraction(weight) * Fraction(norm) for _, norm, weight in clients) / total)
    normalised = []
    for model, norm, weight in clients:
        if norm == 0:
            normalised.append(({name: reference[name] for name in model}, weight))
            continue
        scale = tau_eff / norm
        if scale == 1.0:
            normalised.append((model, weight))
            continue
        x = {}
        for name, value in model.items():
            start = reference[name].to(torch.float64)
            moved = start + scale * (value.to(torch.float64) - start)
            x[name] = moved.to(value.dtype)
        normalised.append((x, weight))
    return normalised, tau_eff


@register_algorithm
class FedNova(FedAvg):
    """FedAvg's round; clients also send ‖a_k‖₁, the server normalises before combining."""

    name = "fednova"
    summary = "FedNova: updates normalised by each client's local work (Wang et al. 2020)"
    Params = FedNovaParams
    shapes = ("star",)
    keeps = ()  # w_t arrives with each round
    toolbox = ("aggregation", "server_optimizer", "privacy", "uplink")
    uplink_kinds = ("model",)  # ‖a_k‖₁ ("norm_a") travels as is

    def check_resources(self, federation: FederationInfo, memory_budget: float) -> None:
        """Refuse a task whose optimiser has no ‖a_k‖₁ formula: not SGD, or SGD with
        momentum under a proximal term."""
        for task in federation.task_specs:
            optimizer = task.optimizer
            if optimizer is None:
                continue
            if optimizer.name != "sgd":
                raise ValueError(
                    f"data.tasks: task '{task.name}' trains with {optimizer.name}; FedNova's "
                    "normalisation is stated for SGD steps (optimizer: null, or sgd)"
                )
            if optimizer.momentum and self.params.mu:
                raise ValueError(
                    f"data.tasks: task '{task.name}' trains with sgd momentum "
                    f"{optimizer.momentum}; FedNova's ‖a_k‖₁ with mu > 0 needs momentum 0"
                )

    def train(self, state: State, inbox: list[Message], ctx: StepContext):
        load_received(state.model, inbox)  # w_t (over the client's local layers, if any)
        params = self.local_params(ctx)
        if params.mu:
            seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")  # FedAvg's draws
            run = fedprox_sgd(state.model, state.data, params, seed)
            state.extras["train_loss"] = run.loss
        else:  # FedAvg's local step itself: equal τ_k then give FedAvg bit for bit
            run = train_local_model(state, ctx, params)
        task = state.data.task
        spec = task.optimizer if task is not None and task.optimizer else params_optimizer(params)
        norm = normalising_norm(run.steps, spec.lr, spec.momentum, params.mu)
        ctx.report(tau=run.steps, norm_a=norm, epochs=params.epochs)
        norm_a = {NORM_A: torch.tensor([norm], dtype=torch.float64)}
        return state, [
            Message(ctx.me, SERVER, "model", self.shared(state.model)),
            Message(ctx.me, SERVER, NORM_A, norm_a),
        ]

    def aggregate(self, state: State, inbox: list[Message], ctx: StepContext):
        samples = ctx.federation.samples
        received: dict[str, dict[str, Tensors]] = {}
        for message in by_sender(inbox):  # sorted by sender: the sums' order is fixed
            received.setdefault(message.src, {})[message.kind] = message.tensors
        uniform = uniform_weights(ctx.toolbox)
        clients = []
        for src, kinds in received.items():
            model, norm = kinds.get("model"), kinds.get(NORM_A, {}).get(NORM_A)
            value = float(norm.reshape(-1)[0]) if norm is not None else math.nan
            # Left out of τ_eff as of the mean: what `combine` would reject anyway.
            if model is None or not is_finite(model) or not math.isfinite(value) or value < 0:
                log.warning("rejected %s's update: a non-finite model or ‖a_k‖₁", src)
                continue
            clients.append((model, value, 1.0 if uniform else samples[index_of(src)]))
        reference = self.shared(state.model)  # w_t: what the sampled clients started from
        normalised, _ = normalised_models(reference, clients)
        return self.take(state, normalised, ctx, reference)  # FedAvg's: combine, step, merge
