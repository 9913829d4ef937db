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

Drawing the maps (round 1, in the actor that owns them): `draw_map` fills each P_ij's own
float32 storage in one pass, `torch.empty(d_ij, d_i).normal_(0, init_std)`, from a
torch.Generator (mt19937; torch's vectorised Box–Muller) seeded with derive_seed(seed, "map",
i, j): bit for bit the values of the earlier `torch.randn(d_ij, d_i)·init_std`, without its
second pass over the map (what a map costs to draw: benchmarks/sheaf_maps.py and
benchmarks/RESULTS.md). Each client's drawing time goes to map_draws.parquet (i, maps,
bytes, seconds).

A round reads each map as few times as it can: P_ij θ_i is computed once per value sent
(after training, after the θ-step) and kept until the next step's gap uses it (θ has not
moved in between), so a round makes 5 passes over a map (3 products, the rank-one update
and its norm) where recomputing the gaps took 7; results are bit for bit the same.

FLOPs: the model passes are counted as every algorithm's (raymtl/flops.py); the map products
and rank-one updates are this step's own maths, outside module calls, so each adds
2·d_ij·d_i by hand (`product_flops`, `add_flops`).

Memory: `persistent_bytes` gives each client's maps, checked against runtime.memory_budget
before any actor starts. The steps allocate only d_i- and d_ij-vectors beside the maps.

Precision: θ, the maps and every product of them are float32 CPU tensors, and the map maths
runs outside autocast (`float32_maths`), also under runtime.precision bf16-mixed, where only
the local SGD of step 1 computes in bfloat16: the θ- and map-steps are fp32's, bit for bit,
and P_ij θ_i travels in float32 (2 × 32 × d_ij bits per edge and round, as above). Under
autocast each map product would cast the d_ij × d_i map to bfloat16 first (a pass over the
map the float32 product does not make: the θ-step took about twice fp32's time) and send
P_ij θ_i in bfloat16.
"""

from __future__ import annotations

import math
import time
from typing import Literal

import torch
from pydantic import Field

from raymtl.algorithms.aggregate import by_sender
from raymtl.algorithms.base import (
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    client_name,
    index_of,
)
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import derive_seed, load_tensors, local_sgd, model_tensors
from raymtl.flops import add_flops
from raymtl.tasks.objectives import task_loss

DIM = "dim"  # round 1: a client's d_i, so that neighbours can size their maps
VALUE = "projection"  # P_ij θ_i
# torch fills tensors of at least this many entries with its vectorised float32 Box–Muller
TORCH_VECTORISED_NORMAL = 16
SENT = "sent"  # extras: (round, {j: P_ij θ_i}) as last sent, until the next step's gaps


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


def draw_map(rows: int, cols: int, std: float, seed: int) -> torch.Tensor:
    """A rows × cols float32 map of N(0, std²) entries from a generator seeded with `seed`,
    drawn straight into its own storage in one pass: bit for bit torch.randn(rows, cols)·std
    of that generator, without randn's second pass to scale."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.empty(rows, cols)
    if values.numel() < TORCH_VECTORISED_NORMAL:
        # torch draws so few values in double precision: scaled after rounding to float32,
        # as randn·std is, they are the same floats (tested)
        return values.normal_(generator=generator).mul_(std)
    return values.normal_(0.0, std, generator=generator)


def float32_maths():
    """The map maths in float32 whatever runtime.precision: autocast off on the CPU, where θ
    (model_tensors' CPU copies) and the maps live."""
    return torch.autocast("cpu", enabled=False)


def product_flops(matrix: torch.Tensor) -> int:
    """FLOPs of a product of a d_ij × d_i map with a vector, or of its rank-one update:
    a multiply and an add per entry. Counted by hand (raymtl/flops.py `add_flops`): the map
    products are the client's own maths, outside any module call."""
    return 2 * matrix.numel()


def l2_loss(l2: float, task):
    """The local loss f_i(θ) + l2·‖θ‖² as a local_sgd hook."""

    def loss(model, x, y):
        penalty = sum((p**2).sum() for p in model.parameters())
        return task_loss(task, model(x), y) + l2 * penalty

    return loss


@register_algorithm
class SheafFMTL(Algorithm):
    name = "sheaf_fmtl"
    combines_otherwise = "a sheaf-Laplacian step through each pair's restriction maps"
    summary = "Sheaf-FMTL: learned restriction maps between peers' models (models may differ)"
    Params = SheafFMTLParams
    shapes = ("peer",)
    task_support = "different"
    model_support = "different"

    def phases(self, round_index, rounds):
        first = [Phase("client", "announce_dim", "all")] if round_index == 1 else []
        return [
            *first,
            Phase("client", "train", "all", trains=True),
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

    def check_resources(self, federation, memory_budget):
        """`map_init: identity` makes P_ij = I, which needs γ = 1 and equal d_i (one model and
        head size for every client): refused before the run, never in round 1's step."""
        if self.params.map_init != "identity":
            return
        models = federation.models or ("",) * federation.num_clients
        kinds = set(zip(models, federation.num_classes, strict=True))
        if self.params.gamma != 1 or len(kinds) > 1:
            raise ValueError(
                "algorithm.params.map_init: identity needs gamma: 1 and one model and head size "
                "for every client (equal d_i)"
            )

    # -- steps -----------------------------------------------------------------------------
    def announce_dim(self, state, inbox, ctx):
        d_i = torch.tensor([self.flat_theta(state.model).numel()])
        neighbours = ctx.federation.neighbours(ctx.index)
        return state, [Message(ctx.me, client_name(j), DIM, {DIM: d_i}) for j in neighbours]

    def init_maps(self, state, inbox, ctx) -> None:
        began = time.perf_counter()
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
                seed = derive_seed(ctx.seed, "map", ctx.me, j)
                maps[j] = draw_map(d_ij, d_i, self.params.init_std, seed)
        state.extras["maps"] = maps
        size = sum(m.numel() * m.element_size() for m in maps.values())
        seconds = time.perf_counter() - began
        ctx.record("map_draws", i=ctx.index, maps=len(maps), bytes=size, seconds=seconds)

    def projections(self, state, ctx, theta: torch.Tensor) -> list[Message]:
        """Send P_ij θ_i to every neighbour j, and keep it for the next step's gaps."""
        maps = state.extras["maps"]
        with float32_maths():
            sent = {j: maps[j] @ theta for j in sorted(maps)}
        add_flops(sum(product_flops(maps[j]) for j in sent))
        state.extras[SENT] = (ctx.round, sent)
        return [Message(ctx.me, client_name(j), VALUE, {VALUE: value}) for j, value in sent.items()]

    def train(self, state, inbox, ctx):
        if ctx.round == 1 or "maps" not in state.extras:
            self.init_maps(state, inbox, ctx)
        task = state.data.task
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
        data, hook = state.data, l2_loss(self.params.l2, task)
        state.extras["train_loss"] = local_sgd(
            state.model, data.train_x, data.train_y, self.params, seed, loss_fn=hook
        ).loss
        return state, self.projections(state, ctx, self.flat_theta(state.model))

    def disagreements(self, state, inbox, ctx, theta) -> dict[int, torch.Tensor]:
        """P_ij θ_i − P_ji θ_j for every neighbour j that sent a finite value. P_ij θ_i is the
        value sent at the end of the previous step of this round (θ and P_ij have not moved
        since, so it is that product bit for bit); computed afresh only when none is kept."""
        maps, out = state.extras["maps"], {}
        sent_round, sent = state.extras.pop(SENT, (None, {}))
        if sent_round != ctx.round:
            sent = {}
        for message in by_sender(inbox):
            theirs = message.tensors[VALUE]
            if torch.isfinite(theirs).all():
                j = index_of(message.src)
                if j not in sent:
                    add_flops(product_flops(maps[j]))
                with float32_maths():
                    mine = sent[j] if j in sent else maps[j] @ theta
                out[j] = mine - theirs.to(mine.dtype)
        return out

    def theta_step(self, state, inbox, ctx):
        theta = self.flat_theta(state.model)
        maps = state.extras["maps"]
        gradient = torch.zeros_like(theta)
        for j, gap in self.disagreements(state, inbox, ctx, theta).items():
            with float32_maths():
                gradient += maps[j].T @ gap
            add_flops(product_flops(maps[j]))
        theta = theta - self.params.lr * self.params.lam * gradient
        self.load_flat(state.model, theta)
        return state, self.projections(state, ctx, theta)

    def map_step(self, state, inbox, ctx):
        theta = self.flat_theta(state.model)
        step = self.params.map_lr * self.params.lam
        for j, gap in self.disagreements(state, inbox, ctx, theta).items():
            # In place, rank one (BLAS ger): no d_ij × d_i temporary, which for two large
            # models would double the memory of their map for a moment.
            with float32_maths():
                state.extras["maps"][j].addr_(gap, theta, alpha=-step)
            add_flops(product_flops(state.extras["maps"][j]))
        for j, matrix in sorted(state.extras["maps"].items()):
            ctx.record("maps", i=ctx.index, j=j, norm=float(torch.linalg.matrix_norm(matrix)))
        return state, []
