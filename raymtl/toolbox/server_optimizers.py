"""The server optimisers of docs/ALGORITHMS.md §9.2: a step on the pseudo-gradient
Δ_t = aggregate(w_k) − w_t instead of taking the aggregate as the next model.

Adaptive ones, Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan 2021,
"Adaptive Federated Optimization", Algorithm 2, per coordinate, with m_{−1} = 0 and
v_{−1} = τ²:

    m_t = β₁·m_{t−1} + (1 − β₁)·Δ_t
    FedAdagrad: v_t = v_{t−1} + Δ_t²
    FedYogi:    v_t = v_{t−1} − (1 − β₂)·Δ_t²·sign(v_{t−1} − Δ_t²)
    FedAdam:    v_t = β₂·v_{t−1} + (1 − β₂)·Δ_t²
    w_{t+1} = w_t + η·m_t / (√v_t + τ)

No bias correction, as the paper's Algorithm 2. Two settings reproduce Flower 1.41's FedAdam:
`v0: 0` (v starts at 0 instead of τ²) and `bias_correction: true`, which uses, in round t
counted from 1, the learning rate η·√(1 − β₂^{t+1}) / (1 − β₁^{t+1}) — the exponent is t + 1,
so the first step uses β^2, exactly as the spec and Flower's code (`server_round + 1.0`)
write it. Here t is the number of this optimiser step (the steps taken before it plus one),
which is Flower's server round when every round steps.

Server momentum, FedAvgM: Hsu, Qi, Brown 2019, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification":

    u_t = β·u_{t−1} + Δ_t
    w_{t+1} = w_t + η·u_t

`none` takes the aggregate as the next model (w_{t+1} = aggregate) and keeps no state.

The state is a plain dict, saved with the checkpoints (torch.save, loadable with
weights_only=True): "m", "v", "u" (dicts name → tensor, created on the first step of each
name) and "steps" (an int, the optimiser steps taken). An empty dict is a fresh state.
Only the names of the aggregate are stepped, and only its floating point tensors (integer
buffers such as batch-norm counters take the aggregate as it is); the other names of w_t are
kept as they are. Everything is computed in the tensors' dtype, on their device.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from raymtl.toolbox.settings import ServerOptimizerSettings

Tensors = dict[str, torch.Tensor]
State = dict
Step = Callable[[ServerOptimizerSettings, Tensors, Tensors, State], "tuple[Tensors, State]"]
SecondMoment = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def server_step(
    settings: ServerOptimizerSettings, weights: Tensors, combined: Tensors, state: State
) -> tuple[Tensors, State]:
    """(w_{t+1}, the new state) from w_t = `weights`, the aggregate `combined` and the
    state of the previous steps; `state` itself is not modified."""
    return STEPS[settings.name](settings, weights, combined, state)


def empty_state() -> State:
    """The state before the first step (an empty dict is read the same way)."""
    return {"m": {}, "v": {}, "u": {}, "steps": 0}


def _stepped_names(weights: Tensors, combined: Tensors) -> list[str]:
    """The names a step moves: float tensors of the aggregate that w_t holds too."""
    return [
        name for name, tensor in combined.items() if tensor.is_floating_point() and name in weights
    ]


def _copy_state(state: State) -> State:
    """A new state dict (new inner dicts, the same tensors) so the caller's is not modified."""
    return {
        "m": dict(state.get("m", {})),
        "v": dict(state.get("v", {})),
        "u": dict(state.get("u", {})),
        "steps": int(state.get("steps", 0)),
    }


def _next_weights(weights: Tensors, combined: Tensors, stepped: Tensors) -> Tensors:
    """w_t with the stepped names replaced, and the aggregate's other names as aggregated."""
    next_weights = dict(weights)
    next_weights.update({name: t for name, t in combined.items() if name not in stepped})
    next_weights.update(stepped)
    return next_weights


def _no_step(settings, weights: Tensors, combined: Tensors, state: State):
    return combined, state


def _momentum_step(settings, weights: Tensors, combined: Tensors, state: State):
    new_state = _copy_state(state)
    beta, lr = settings.momentum, settings.step_size
    stepped = {}
    for name in _stepped_names(weights, combined):
        delta = combined[name] - weights[name]
        previous = new_state["u"].get(name)
        momentum = delta if previous is None else beta * previous + delta
        new_state["u"][name] = momentum
        stepped[name] = weights[name] + lr * momentum
    new_state["steps"] += 1
    return _next_weights(weights, combined, stepped), new_state


def _adagrad_v(v: torch.Tensor, delta_squared: torch.Tensor, beta2: float) -> torch.Tensor:
    return v + delta_squared


def _yogi_v(v: torch.Tensor, delta_squared: torch.Tensor, beta2: float) -> torch.Tensor:
    return v - (1 - beta2) * delta_squared * torch.sign(v - delta_squared)


def _adam_v(v: torch.Tensor, delta_squared: torch.Tensor, beta2: float) -> torch.Tensor:
    return beta2 * v + (1 - beta2) * delta_squared


SECOND_MOMENTS: dict[str, SecondMoment] = {
    "fedadagrad": _adagrad_v,
    "fedyogi": _yogi_v,
    "fedadam": _adam_v,
}


def adaptive_lr(settings: ServerOptimizerSettings, step: int) -> float:
    """η, or with `bias_correction` η·√(1 − β₂^{t+1}) / (1 − β₁^{t+1}) for step t counted
    from 1 (Flower 1.41's FedAdam, exponent t + 1 as it writes it)."""
    lr = settings.step_size
    if not settings.bias_correction:
        return lr
    beta1, beta2 = settings.betas
    return lr * math.sqrt(1 - beta2 ** (step + 1)) / (1 - beta1 ** (step + 1))


def _adaptive_step(settings, weights: Tensors, combined: Tensors, state: State):
    new_state = _copy_state(state)
    second_moment = SECOND_MOMENTS[settings.name]
    beta1, beta2 = settings.betas
    tau = settings.tau
    v_start = settings.v0 if settings.v0 is not None else tau**2
    lr = adaptive_lr(settings, new_state["steps"] + 1)
    stepped = {}
    for name in _stepped_names(weights, combined):
        w = weights[name]
        delta = combined[name] - w
        m = new_state["m"].get(name)
        v = new_state["v"].get(name)
        m = torch.zeros_like(w) if m is None else m
        v = torch.full_like(w, v_start) if v is None else v
        m = beta1 * m + (1 - beta1) * delta
        v = second_moment(v, delta * delta, beta2)
        new_state["m"][name], new_state["v"][name] = m, v
        stepped[name] = w + lr * m / (torch.sqrt(v) + tau)
    new_state["steps"] += 1
    return _next_weights(weights, combined, stepped), new_state


STEPS: dict[str, Step] = {
    "none": _no_step,
    "momentum": _momentum_step,
    "fedadam": _adaptive_step,
    "fedyogi": _adaptive_step,
    "fedadagrad": _adaptive_step,
}
