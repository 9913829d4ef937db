"""FedU and dFedU — Laplacian-regularised federated multi-task learning (baselines).

Dinh et al., "A New Look and Convergence Rate of Federated Multi-Task Learning with
Laplacian Regularization", IEEE TNNLS 2022 (docs/ALGORITHMS.md §6 and §7).

Round t, every participating client k after R = E local epochs of SGD (lr η):
    w_k ← w_k − η·λ·R·Σ_{l∈N(k), l≠k} a_kl·(w_k − w_l)        (all k simultaneously)
FedU: on the server, N(k) = the sampled clients S_t; each k ∈ S_t gets its w_k back.
dFedU: peer to peer, N(k) = k's neighbours in the communication graph.
a_kl: `similarity: random` is the reference setting — a symmetric U(0,1) matrix drawn once
per seed, entries < 0.25 set to 0; `ones` gives a_kl = 1; or a given N×N matrix.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    client_name,
    index_of,
)
from raymtl.algorithms.fedavg import by_sender, train_local_model
from raymtl.algorithms.registry import register
from raymtl.algorithms.training import (
    derive_seed,
    is_finite,
    load_received,
    load_tensors,
    model_tensors,
)

Tensors = dict[str, torch.Tensor]


class FedUParams(LocalTrainingParams):
    epochs: int = Field(5, ge=1, description="local epochs per round (R)")
    lam: float = Field(0.03, ge=0, description="Laplacian regularisation strength λ")
    similarity: Literal["random", "ones"] | list[list[float]] = Field(
        "random",
        description="a_kl: 'random' (symmetric U(0,1), < threshold zeroed, seeded), "
        "'ones', or a given N×N matrix",
    )
    threshold: float = Field(0.25, ge=0, le=1, description="random a_kl below this are set to 0")


def random_similarity(num_clients: int, seed: int, threshold: float = 0.25) -> np.ndarray:
    """The reference a_kl: symmetric U(0,1), zero diagonal, entries < threshold set to 0."""
    rng = np.random.default_rng(derive_seed(seed, "fedu-similarity"))
    upper = np.triu(rng.uniform(0.0, 1.0, size=(num_clients, num_clients)), k=1)
    a = upper + upper.T
    a[a < threshold] = 0.0
    return a


def similarity_matrix(params: FedUParams, num_clients: int, seed: int) -> np.ndarray:
    """a_kl for this federation (N×N, symmetric)."""
    if params.similarity == "random":
        return random_similarity(num_clients, seed, params.threshold)
    if params.similarity == "ones":
        return np.ones((num_clients, num_clients)) - np.eye(num_clients)
    a = np.asarray(params.similarity, dtype=float)
    if a.shape != (num_clients, num_clients):
        raise ValueError(f"algorithm.params.similarity: expected {num_clients}×{num_clients}")
    return a


def laplacian_step(
    models: dict[int, Tensors], weights: dict[int, dict[int, float]], step: float
) -> dict[int, Tensors]:
    """w_k − step·Σ_l a_kl·(w_k − w_l) for every k of `weights`, all from the models as given.

    Simultaneous, not sequential: every update reads the models passed in, never one already
    updated. Neighbours missing from `models` (dropped, non-finite) are skipped.
    """
    updated, scratch = {}, {}
    for k in sorted(weights):
        own = models[k]
        new = {name: value.clone() for name, value in own.items()}
        for l_ in sorted(weights.get(k, {})):
            a = weights[k][l_]
            if l_ == k or a == 0 or l_ not in models:
                continue
            for name, value in new.items():
                # (w_k − w_l)·(step·a) in one reused buffer: the same float operations as
                # the plain expression, without two fresh model-sized tensors per pair (at
                # 100 clients of a 1.7M-parameter CNN, the allocations cost more than the maths)
                buffer = scratch.setdefault(name, torch.empty_like(own[name]))
                torch.sub(own[name], models[l_][name], out=buffer)
                value.sub_(buffer.mul_(step * a))
        updated[k] = new
    return updated


def pairwise(a: np.ndarray, clients: list[int]) -> dict[int, dict[int, float]]:
    """{k: {l: a_kl}} restricted to `clients`."""
    return {k: {l_: float(a[k, l_]) for l_ in clients if l_ != k} for k in clients}


@register
class FedU(Algorithm):
    name = "fedu"
    summary = "FedU: local SGD, then a Laplacian step among sampled clients on the server"
    Params = FedUParams
    shapes = ("star",)

    def phases(self, round_index, rounds):
        return [
            Phase("client", "train", "sampled"),
            Phase("server", "regularise", "inbox"),
            Phase("client", "receive", "inbox"),
        ]

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        return state, [Message(ctx.me, SERVER, "model", model_tensors(state.model))]

    def regularise(self, state, inbox, ctx):
        models = {index_of(m.src): m.tensors for m in by_sender(inbox) if is_finite(m.tensors)}
        a = similarity_matrix(self.params, ctx.federation.num_clients, ctx.seed)
        step = self.params.lr * self.params.lam * self.params.epochs
        updated = laplacian_step(models, pairwise(a, sorted(models)), step)
        return state, [Message(SERVER, client_name(k), "model", w) for k, w in updated.items()]

    def receive(self, state, inbox, ctx):
        load_received(state.model, inbox)
        return state, []


@register
class DFedU(Algorithm):
    name = "dfedu"
    summary = "dFedU: local SGD, then a Laplacian step with graph neighbours (peer to peer)"
    Params = FedUParams
    shapes = ("peer",)

    def phases(self, round_index, rounds):
        return [Phase("client", "train", "all"), Phase("client", "regularise", "all")]

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        tensors = model_tensors(state.model)
        state.extras["sent"] = tensors
        neighbours = ctx.federation.neighbours(ctx.index)
        return state, [Message(ctx.me, client_name(j), "model", tensors) for j in neighbours]

    def regularise(self, state, inbox, ctx):
        k = ctx.index
        models = {k: state.extras.pop("sent")}
        models |= {index_of(m.src): m.tensors for m in by_sender(inbox) if is_finite(m.tensors)}
        a = similarity_matrix(self.params, ctx.federation.num_clients, ctx.seed)
        weights = {k: {l_: float(a[k, l_]) for l_ in models if l_ != k}}
        step = self.params.lr * self.params.lam * self.params.epochs
        updated = laplacian_step(models, weights, step)[k]
        load_tensors(state.model, updated)
        return state, []
