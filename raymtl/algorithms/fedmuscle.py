"""FedMuscle and pairwise InfoNCE: clients align their representations on public data (star).

Paper: "Toward Enhancing Representation Learning in Federated Multi-Task Settings" (ICLR
2026); the maths is docs/ALGORITHMS.md §14–15 and raymtl/algorithms/muscle.py.

Every client n keeps its own model θ^n = (w^n, h^n): w^n = backbone + a projection to d unit
dims (the representation branch, models/registry.py), h^n its task head. Round t, S_t sampled:
    client n ∈ S_t:  E epochs on its own task (loss, head and optimiser of its task)
    T times (contrastive step s):
      server:   I_s ← B public indices (seeded by seed, t, s), sent to S_t
      client:   Z^n = w^n(public[I_s]) ∈ R^{B×d} (eval mode) → server
      server:   per anchor n: M partners m_1..m_M drawn (seeded) from S_t \\ {n};
                S^n ∈ R^{B^M×d}, α^n ∈ R^{B^M} (muscle.tuple_targets) → n
      client:   w^n ← w^n − η_cl·∇_{w^n} L^n_Muscle(Z^n, S^n, α^n)   (h^n untouched)
Bits per contrastive step and client: up B·d·32; down B^M·(d+1)·32 and the B indices (64 bit).
Nothing of a model and no private sample travels. `downlink: partners` sends the M partner
matrices instead (M·B·d floats) and the client forms the same loss (muscle.py).

pairwise_infonce: the same rounds; the server returns the partners' Z^m (all of S_t \\ {n} by
default) and client n minimises Σ_m InfoNCE(Z^n, Z^m) at temperature τ.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from raymtl.algorithms.aggregate import by_sender, is_finite
from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    State,
    client_name,
    index_of,
    role_of,
)
from raymtl.algorithms.muscle import (
    gamma_of,
    muscle_loss,
    muscle_loss_from_partners,
    pairwise_infonce,
    tuple_targets,
)
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import derive_seed, sample_size, train_local_model

MIB = 2**20


class FedMuscleParams(LocalTrainingParams):
    contrastive_steps: int = Field(20, ge=1, description="contrastive steps per round (T)")
    public_batch: int = Field(32, ge=2, description="public samples per step (B)")
    partners: int | None = Field(3, ge=1, description="partners per anchor (M); null = all")
    dim: int = Field(256, ge=1, description="representation dims (d)")
    tau: float = Field(0.2, gt=0, description="temperature τ")
    tau_prime: float = Field(0.15, gt=0, description="τ' of the weights α (γ = 1/τ' − 1/τ)")
    align_lr: float = Field(0.005, gt=0, description="SGD step size of the contrastive steps")
    downlink: Literal["tuples", "partners"] = Field(
        "tuples", description="tuples: S and α as in the paper; partners: the M matrices Z^m"
    )
    max_downlink_mib: float = Field(
        64.0, gt=0, description="refuse a downlink above this per client and step (MiB)"
    )


class RepresentationAlignment(Algorithm):
    """The round shared by FedMuscle and pairwise InfoNCE; they differ in `targets`/`loss`."""

    Params = FedMuscleParams
    shapes = ("star",)
    task_support = "different"
    model_support = "different"
    uses_public = True
    inputs = ("images", "vectors")
    input_refusal = "it aligns representations of a public set of images or feature vectors"

    def phases(self, round_index, rounds):
        steps = [Phase("client", "train", "sampled", trains=True)]
        for _ in range(self.params.contrastive_steps):
            steps += [
                Phase("server", "pick", "all"),
                Phase("client", "embed", "inbox"),
                Phase("server", "pair", "inbox"),
                Phase("client", "align", "inbox"),
            ]
        return steps

    def init_state(self, participant, data, federation):
        if role_of(participant) != "client":
            return State()
        model = self.model_factory(participant, data.num_classes)
        # Right after the seeded model init: one architecture gets one projection init.
        model.add_representation(self.params.dim)
        return State(model=model, data=data)

    # -- client
    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        return state, []

    def embed(self, state, inbox, ctx):
        indices = inbox[0].tensors["indices"]
        state.extras["public_batch"] = indices
        state.model.eval()  # the Z^n uploaded is the function differentiated in `align`
        with torch.no_grad():
            z = state.model.represent(state.data.public_x[indices.to(state.data.public_x.device)])
        return state, [Message(ctx.me, SERVER, "representations", {"z": z.cpu()})]

    def align(self, state, inbox, ctx):
        indices = state.extras.pop("public_batch")
        model, public = state.model, state.data.public_x
        model.eval()
        parameters = model.representation_parameters()
        optimizer = torch.optim.SGD(parameters, lr=self.params.align_lr)
        z = model.represent(public[indices.to(public.device)])
        device = {name: t.to(z.device) for name, t in inbox[0].tensors.items()}
        loss = self.loss(z, device)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ctx.record("alignment", client=ctx.index, loss=float(loss.detach()))
        return state, []

    # -- server
    def pick(self, state, inbox, ctx):
        if state.extras.get("round") != ctx.round:
            state.extras.update(round=ctx.round, step=0)
        state.extras["step"] += 1
        generator = torch.Generator().manual_seed(
            derive_seed(ctx.seed, ctx.round, state.extras["step"], "public-batch")
        )
        indices = torch.randperm(ctx.federation.public_size, generator=generator)
        batch = {"indices": indices[: self.params.public_batch].sort().values}
        return state, [Message(SERVER, client_name(i), "public_batch", batch) for i in ctx.sampled]

    def pair(self, state, inbox, ctx):
        messages = [m for m in by_sender(inbox) if is_finite(m.tensors)]
        if not messages:
            return state, []
        stacked = torch.stack([m.tensors["z"] for m in messages])  # (K, B, d)
        outbox = []
        for position, message in enumerate(messages):
            client = index_of(message.src)
            chosen = self.choose_partners(position, len(messages), client, state, ctx)
            if chosen:
                targets = self.targets(stacked[chosen])
                kind = "tuples" if "tuples" in targets else "partners"  # what travels down
                outbox.append(Message(SERVER, message.src, kind, targets))
        return state, outbox

    def choose_partners(self, anchor: int, count: int, client: int, state, ctx) -> list[int]:
        """Positions of the anchor's partners among the K senders (seeded per anchor)."""
        others = [q for q in range(count) if q != anchor]
        wanted = min(self.params.partners or len(others), len(others))
        generator = torch.Generator().manual_seed(
            derive_seed(ctx.seed, ctx.round, state.extras.get("step"), client, "partners")
        )
        order = torch.randperm(len(others), generator=generator)[:wanted]
        return [others[q] for q in sorted(order.tolist())]

    def targets(self, partners: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"partners": partners}

    def loss(self, z: torch.Tensor, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    # -- what a configuration costs, before any actor starts
    def downlink_floats(self, partners: int) -> tuple[int, str]:
        """Floats sent to one anchor per step, and how they are counted."""
        p = self.params
        return partners * p.public_batch * p.dim, f"M·B·d = {partners}·{p.public_batch}·{p.dim}"

    def check_resources(self, federation, memory_budget):
        p = self.params
        if federation.public_size < p.public_batch:
            raise ValueError(
                f"algorithm.params.public_batch: B = {p.public_batch} exceeds "
                f"data.public.size ({federation.public_size})"
            )
        sampled = sample_size(p.sample_fraction, federation.num_clients)
        partners = min(p.partners or federation.num_clients, max(sampled - 1, 1))
        floats, formula = self.downlink_floats(partners)
        per_client, knobs = floats * 4, "lower public_batch (B), partners (M) or dim (d)"
        if "B^M" in formula:
            knobs += ", or set downlink: partners (the same loss from M·B·d floats)"
        if per_client > p.max_downlink_mib * MIB:
            raise ValueError(
                f"algorithm.params: {self.name} sends {per_client / MIB:,.1f} MiB to each client "
                f"per contrastive step ({formula} floats), over max_downlink_mib "
                f"{p.max_downlink_mib:g}; {knobs}"
            )
        held = per_client * sampled  # every anchor's targets wait in the store at once
        if held > memory_budget:
            raise ValueError(
                f"algorithm.params: the server holds {held / MIB:,.1f} MiB of targets per step "
                f"({sampled} clients × {formula} floats), over the memory budget "
                f"{memory_budget / MIB:,.0f} MiB; {knobs}"
            )


@register_algorithm
class FedMuscle(RepresentationAlignment):
    name = "fedmuscle"
    combines_otherwise = "clients align representations on public data; no model is averaged"
    summary = "FedMuscle: N-model contrastive alignment (Muscle loss) on public data"

    def targets(self, partners):
        if self.params.downlink == "partners":
            return {"partners": partners}
        tuples, alpha = tuple_targets(partners, gamma_of(self.params.tau, self.params.tau_prime))
        return {"tuples": tuples, "alpha": alpha}

    def loss(self, z, targets):
        p = self.params
        gamma = gamma_of(p.tau, p.tau_prime)
        if "partners" in targets:
            return muscle_loss_from_partners(z, targets["partners"], p.tau, gamma)
        count = 1
        while z.shape[0] ** count < targets["alpha"].numel():
            count += 1
        return muscle_loss(z, targets["tuples"], targets["alpha"], p.tau, count)

    def downlink_floats(self, partners):
        if self.params.downlink == "partners":
            return super().downlink_floats(partners)
        p = self.params
        floats = p.public_batch**partners * (p.dim + 1)
        return floats, f"B^M·(d+1) = {p.public_batch}^{partners}·{p.dim + 1}"


class PairwiseParams(FedMuscleParams):
    partners: int | None = Field(None, ge=1, description="partners per anchor; null = all")


@register_algorithm
class PairwiseInfoNCE(RepresentationAlignment):
    name = "pairwise_infonce"
    combines_otherwise = "clients align representations on public data; no model is averaged"
    summary = "Pairwise InfoNCE: Σ_m InfoNCE(Z^n, Z^m) on public data (FedMuscle baseline)"
    Params = PairwiseParams

    def loss(self, z, targets):
        return pairwise_infonce(z, targets["partners"], self.params.tau)
