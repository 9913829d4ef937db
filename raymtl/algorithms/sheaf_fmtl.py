"""Sheaf-FMTL — sheaf-Laplacian regularisation over a peer graph (models may differ).

Ben Issaid et al., "Tackling Feature and Sample Heterogeneity in Decentralized Multi-Task
Learning: A Sheaf-Theoretic Approach" (docs/ALGORITHMS.md §13).

    min Σ_i f_i(θ_i) + (λ/2)·Σ_{(i,j)∈E} ‖P_ij θ_i − P_ji θ_j‖²

θ_i is the flattened model of client i (d_i values; clients' models may differ), P_ij ∈
R^{d_ij×d_i} the restriction map client i owns for edge (i, j), d_ij = ⌊γ·min(d_i, d_j)⌋,
initialised N(0, init_std²). Round, every client i in parallel:
    1. one local epoch of SGD (lr α) on f_i(θ_i) + l2·‖θ_i‖²; send P_ij θ_i to each j
    2. θ_i ← θ_i − α·λ·Σ_j P_ijᵀ (P_ij θ_i − P_ji θ_j);     send the new P_ij θ_i
    3. P_ij ← P_ij − η·λ·(P_ij θ_i − P_ji θ_j)·θ_iᵀ           (with the new values)
Round 1 first exchanges d_i with the neighbours (one integer per edge), so every client
sizes its own maps. Only d_ij-vectors travel: bits per edge and round = 2 × 32 × d_ij each
way — never a model, never a map.

`map_params` restricts θ to the parameters whose names start with the given prefixes (e.g.
the head): maps cost Σ_j d_ij·d_i floats, so acting on fewer parameters cuts memory and bits
in proportion. The paper (and its code) maps the whole model; it does not study a partial θ,
and a partial θ couples clients only through those layers. With γ = 1, P = I and η = 0 a
round is exactly dFedU's with a_kl = 1 (`map_init: identity`, tested).

Memory: `persistent_bytes` gives each client's maps, checked against runtime.memory_budget
before any actor starts.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from raymtl.algorithms.base import (
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    client_name,
    index_of,
)
from raymtl.algorithms.fedavg import by_sender
from raymtl.algorithms.registry import register
from raymtl.algorithms.training import derive_seed, load_tensors, local_sgd, model_tensors
from raymtl.tasks.objectives import task_loss

DIM = "dim"  # round 1: a client's d_i, so that neighbours can size their maps
VALUE = "projection"  # P_ij θ_i


class SheafFMTLParams(LocalTrainingParams):
    lr: float = Field(0.005, gt=0, description="α: local SGD and θ-step learning rate")
    lam: float = Field(0.001, ge=0, description="λ: sheaf-Laplacian strength")
    map_lr: float = Field(1e-4, ge=0, description="η: restriction-map learning rate (0: frozen)")
    gamma: float = Field(0.01, gt=0, le=1, description="γ: d_ij = ⌊γ·min(d_i, d_j)⌋")
    l2: float = Field(0.01, ge=0, description="l2·‖θ‖² in the local loss (0 = official code)")
    map_init: Literal["normal", "identity"] = Field(
        "normal", description="normal: N(0, init_std²); identity: P = I (needs γ = 1)"
    )
    init_std: float = Field(0.01, gt=0, description="std of the maps' normal init")
    map_params: tuple[str, ...] | None = Field(
        None, description="parameter-name prefixes θ covers; null = the whole model (paper)"
    )


def interaction_dim(d_i: int, d_j: int, gamma: float) -> int:
    """d_ij = ⌊γ·min(d_i, d_j)⌋ (at least 1)."""
    return max(1, math.floor(gamma * min(d_i, d_j) + 1e-9))


def l2_loss(l2: float, task):
    """The local loss f_i(θ) + l2·‖θ‖² as a local_sgd hook."""

    def loss(model, x, y):
        penalty = sum((p**2).sum() for p in model.parameters())
        return task_loss(task, model(x), y) + l2 * penalty

    return loss


@register
class SheafFMTL(Algorithm):
    name = "sheaf_fmtl"
    summary = "Sheaf-FMTL: learned restriction maps between peers' models (models may differ)"
    Params = SheafFMTLParams
    shapes = ("peer",)
    task_support = "different"
    model_support = "different"

    def phases(self, round_index, rounds):
        first = [Phase("client", "announce_dim", "all")] if round_index == 1 else []
        return [
            *first,
            Phase("client", "train", "all"),
            Phase("client", "theta_step", "all"),
            Phase("client", "map_step", "all"),
        ]

    # -- θ as a vector ---------------------------------------------------------------------
    def theta(self, model) -> dict[str, torch.Tensor]:
        return model_tensors(model, self.params.map_params)

    def flat_theta(self, model) -> torch.Tensor:
        tensors = self.theta(model)
        return torch.cat([tensors[n].reshape(-1) for n in sorted(tensors)])

    def load_flat(self, model, vector: torch.Tensor) -> None:
        tensors, start, out = self.theta(model), 0, {}
        for name in sorted(tensors):
            size = tensors[name].numel()
            out[name] = vector[start : start + size].reshape(tensors[name].shape)
            start += size
        load_tensors(model, out)

    memory_knobs = (
        "lower algorithm.params.gamma, a sparser graph (topology.params), smaller models, "
        "or maps on fewer parameters (algorithm.params.map_params)"
    )

    def state_size(self, model) -> int:
        """d_i: the entries of θ this model gives."""
        return self.flat_theta(model).numel()

    def persistent_bytes(self, dims: list[int], fed) -> list[int]:
        """Bytes of each client's maps: Σ_j d_ij·d_i float32 values."""
        gamma = self.params.gamma
        return [
            4 * dims[i] * sum(interaction_dim(dims[i], dims[j], gamma) for j in fed.neighbours(i))
            for i in range(fed.num_clients)
        ]

    # -- steps -----------------------------------------------------------------------------
    def announce_dim(self, state, inbox, ctx):
        d_i = torch.tensor([self.flat_theta(state.model).numel()])
        neighbours = ctx.federation.neighbours(ctx.index)
        return state, [Message(ctx.me, client_name(j), DIM, {DIM: d_i}) for j in neighbours]

    def init_maps(self, state, inbox, ctx) -> None:
        d_i = self.flat_theta(state.model).numel()
        maps = {}
        for message in by_sender(inbox):
            j = index_of(message.src)
            d_ij = interaction_dim(d_i, int(message.tensors[DIM]), self.params.gamma)
            if self.params.map_init == "identity":
                if d_ij != d_i:
                    raise ValueError("algorithm.params.map_init: identity needs γ = 1, equal d")
                maps[j] = torch.eye(d_i)
            else:
                generator = torch.Generator().manual_seed(derive_seed(ctx.seed, "map", ctx.me, j))
                maps[j] = torch.randn(d_ij, d_i, generator=generator).mul_(self.params.init_std)
        state.extras["maps"] = maps

    def projections(self, state, ctx, theta: torch.Tensor) -> list[Message]:
        maps = state.extras["maps"]
        return [
            Message(ctx.me, client_name(j), VALUE, {VALUE: maps[j] @ theta}) for j in sorted(maps)
        ]

    def train(self, state, inbox, ctx):
        if ctx.round == 1 or "maps" not in state.extras:
            self.init_maps(state, inbox, ctx)
        task = state.data.task
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
        data, hook = state.data, l2_loss(self.params.l2, task)
        state.extras["train_loss"] = local_sgd(
            state.model, data.train_x, data.train_y, self.params, seed, loss_fn=hook
        )
        return state, self.projections(state, ctx, self.flat_theta(state.model))

    def disagreements(self, state, inbox, theta) -> dict[int, torch.Tensor]:
        """P_ij θ_i − P_ji θ_j for every neighbour j that sent a finite value."""
        maps, out = state.extras["maps"], {}
        for message in by_sender(inbox):
            theirs = message.tensors[VALUE]
            if torch.isfinite(theirs).all():
                j = index_of(message.src)
                out[j] = maps[j] @ theta - theirs
        return out

    def theta_step(self, state, inbox, ctx):
        theta = self.flat_theta(state.model)
        maps = state.extras["maps"]
        gradient = torch.zeros_like(theta)
        for j, gap in self.disagreements(state, inbox, theta).items():
            gradient += maps[j].T @ gap
        theta = theta - self.params.lr * self.params.lam * gradient
        self.load_flat(state.model, theta)
        return state, self.projections(state, ctx, theta)

    def map_step(self, state, inbox, ctx):
        theta = self.flat_theta(state.model)
        step = self.params.map_lr * self.params.lam
        for j, gap in self.disagreements(state, inbox, theta).items():
            # In place, rank one (BLAS ger): no d_ij × d_i temporary, which for two large
            # models would double the memory of their map for a moment.
            state.extras["maps"][j].addr_(gap, theta, alpha=-step)
        for j, matrix in sorted(state.extras["maps"].items()):
            ctx.record("maps", i=ctx.index, j=j, norm=float(torch.linalg.matrix_norm(matrix)))
        return state, []
