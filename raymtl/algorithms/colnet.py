"""ColNet — decentralized task groups, rotating task leaders, conflict-averse aggregation.

Feng, Kohler, Huertas Celdrán, Bovet and Stiller, "ColNet: Collaborative Optimization in
Decentralized Federated Multi-task Learning Systems", 2025 (docs/ALGORITHMS.md §10–12); HCA from
FedHCA2 (Lu et al., CVPR 2024). No server: clients of one task form a task group M_g; all
share the backbone b, heads h_i (outputs, loss, optimiser) are per task and never leave
their client. Round t < T:

    (1) client i ∈ M_g:  (b_i, h_i) ← LocalTrain(E epochs, the task's loss and optimiser);
                         sends b_i to every other member of M_g
    (2) client i:        b_i ← b̄_g = (1/|M_g|) Σ_{j∈M_g} b_j              (equal weights)
    (3) leader of g:     Δ_g = b̄_g − b_g⁰  (b_g⁰: the group's backbone at the start of t);
                         sends Δ_g to the other leaders only
    (4) leader of g:     U_g = HCA(Δ_1 … Δ_L; ca_c);  sends b̄_g + U_g to every member;
                         hands the role to a random other member (seeded) and announces
                         the new holder to the other leaders
Round T trains only. The leader is a client with an extra duty: the role is hosted by a
light `leader/<g>` participant, and its traffic is charged to the client holding it (the
holder's own hand-offs to and from its role stay on its machine and are not counted).

Bits per round t < T, with |b| the backbone's bits and L groups:
    intra  Σ_g |M_g|(|M_g| − 1)·|b|,  deltas  L(L − 1)·|b|,  broadcast  Σ_g (|M_g| − 1)·|b|.

`hca_base: round_start` adds U_g to b_g⁰ instead (FedHCA2's reading: the group's own delta
then counts once, inside U_g, rather than twice); results/colnet.md measures both.

The leader's state is rebuilt every round from its holder's hand-off (b̄_g and b_g⁰, which
every member holds), so a lost leader host is replaced mid-run and the next member of the
group takes the role (`rehost`). Baselines: `intra_group` (steps 1–2 only) and `fedper_ic`
(FedPer(I&C): step 4 sets every group to the plain mean of the group means).
"""

from __future__ import annotations

import time
from typing import Literal

import torch
from pydantic import Field, model_validator

from raymtl.algorithms.aggregate import by_sender, weighted_average
from raymtl.algorithms.base import (
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    client_name,
    index_of,
    leader_name,
)
from raymtl.algorithms.hca import conflict_averse_update
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import derive_seed, load_tensors, model_tensors, train_local_model

BACKBONE = ("backbone.",)
NEXT_LEADER = "next_leader"  # the announced holder of the group's leadership next round


class ColNetParams(LocalTrainingParams):
    epochs: int = Field(2, ge=1, description="local epochs per round (E)")
    batch_size: int = Field(64, ge=1, description="local mini-batch size")
    ca_c: float = Field(0.4, ge=0, allow_inf_nan=False, description="HCA conflict aversion")
    hca_base: Literal["group_mean", "round_start"] = Field(
        "group_mean",
        description="what U_g is added to: b̄_g (§4; Algorithm 1, line 18) or b_g⁰ (FedHCA2's "
        "start-of-round reading: the group's own update then counts once, inside U_g)",
    )

    @model_validator(mode="after")
    def _every_client_every_round(self) -> ColNetParams:
        if self.sample_fraction != 1.0:
            raise ValueError("sample_fraction: every client trains every round here (use 1.0)")
        return self


def flatten(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tensors concatenated in name order (one row of HCA's G)."""
    return torch.cat([tensors[name].reshape(-1).float() for name in sorted(tensors)])


def unflatten(vector: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`vector` cut back into tensors named and shaped as `like`."""
    out, start = {}, 0
    for name in sorted(like):
        size = like[name].numel()
        out[name] = vector[start : start + size].reshape(like[name].shape).to(like[name].dtype)
        start += size
    return out


def first_holder(members: list[int], seed: int, group: int) -> int:
    """Who holds group `group`'s leadership in round 1 (seeded)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "leader", group))
    return members[int(torch.randint(len(members), (1,), generator=generator))]


def next_holder(members: list[int], holder: int, seed: int, round_index: int, group: int) -> int:
    """A random other member takes the role after the round (the holder itself if alone)."""
    others = [i for i in members if i != holder] or [holder]
    generator = torch.Generator().manual_seed(derive_seed(seed, round_index, "rotate", group))
    return others[int(torch.randint(len(others), (1,), generator=generator))]


@register_algorithm
class IntraGroup(Algorithm):
    """Clients average their backbones within their task group only (ColNet's steps 1–2)."""

    name = "intra_group"
    combines_otherwise = "a task group's members mix their models peer to peer"
    summary = "Intra-group: backbones averaged within each task group only (ColNet baseline)"
    Params = ColNetParams
    shapes = ("groups",)
    task_support = "different"

    def phases(self, round_index, rounds):
        if round_index == rounds:
            return [Phase("client", "train", "all", trains=True)]
        return [
            Phase("client", "train", "all", trains=True),
            Phase("client", "intra_average", "all"),
        ]

    def train(self, state, inbox, ctx):
        if self.uses_leaders:  # b_g⁰, for the hand-off should this client hold the leadership
            state.extras["round_start"] = model_tensors(state.model, BACKBONE)
        train_local_model(state, ctx, self.params)
        if ctx.round == ctx.rounds:  # the last round trains only
            return state, []
        backbone = model_tensors(state.model, BACKBONE)
        peers = [j for j in self.members(ctx) if j != ctx.index]
        return state, [Message(ctx.me, client_name(j), "backbone", backbone) for j in peers]

    def members(self, ctx) -> list[int]:
        return ctx.federation.members(ctx.federation.tasks[ctx.index])

    def intra_average(self, state, inbox, ctx):
        own = model_tensors(state.model, BACKBONE)
        received = [(m.tensors, 1.0) for m in by_sender(inbox)]
        group_mean = weighted_average([(own, 1.0), *received])  # equal weights
        if group_mean is not None:
            load_tensors(state.model, group_mean)
        return state, self.hand_off(state, ctx)

    def hand_off(self, state, ctx) -> list[Message]:
        return []


@register_algorithm
class ColNet(IntraGroup):
    name = "colnet"
    combines_otherwise = "task leaders combine the groups' backbones by HCA (conflict-averse)"
    summary = "ColNet: task groups, rotating task leaders, HCA across groups (Feng et al. 2025)"
    uses_leaders = True

    def phases(self, round_index, rounds):
        if round_index == rounds:
            return [Phase("client", "train", "all", trains=True)]
        return [
            *super().phases(round_index, rounds),
            Phase("leader", "cross_exchange", "inbox"),
            Phase("leader", "cross_aggregate", "all"),
            Phase("leader", "note_leaders", "inbox"),
            Phase("client", "receive", "inbox"),
        ]

    # -- clients ---------------------------------------------------------------------------
    def holder(self, state, ctx) -> int:
        group = ctx.federation.tasks[ctx.index]
        if "holder" not in state.extras:
            state.extras["holder"] = first_holder(self.members(ctx), ctx.seed, group)
        return state.extras["holder"]

    def hand_off(self, state, ctx) -> list[Message]:
        """The holder passes b̄_g and b_g⁰ to the role it holds (on its own machine)."""
        if self.holder(state, ctx) != ctx.index:
            return []
        leader = leader_name(ctx.federation.tasks[ctx.index])
        group_mean = model_tensors(state.model, BACKBONE)
        return [
            Message(ctx.me, leader, "group_backbone", group_mean),
            Message(ctx.me, leader, "round_start", state.extras["round_start"]),
        ]

    def receive(self, state, inbox, ctx):
        for message in inbox:
            update = dict(message.tensors)
            state.extras["holder"] = int(update.pop(NEXT_LEADER))
            load_tensors(state.model, update)
        return state, []

    # -- task leaders ----------------------------------------------------------------------
    def rehost(self, participant, state):
        state.extras["failover"] = True  # the next member of the group takes the role over
        return state

    def cross_exchange(self, state, inbox, ctx):
        """Δ_g = b̄_g − b_g⁰, sent to the other leaders."""
        handed = {m.kind: m for m in inbox}
        group_mean = handed["group_backbone"].tensors
        start = handed["round_start"].tensors
        holder = index_of(handed["group_backbone"].src)
        if state.extras.get("failover"):
            members = ctx.federation.members(ctx.index)
            holder = members[(members.index(holder) + 1) % len(members)]
        state.extras.update(group_mean=group_mean, holder=holder)
        ctx.held_by(holder)
        delta = {name: group_mean[name] - start[name] for name in group_mean}
        state.extras["delta"] = delta
        groups = ctx.federation.task_groups()
        others = [leader_name(g) for g in groups if g != ctx.index]
        return state, [Message(ctx.me, other, "delta", delta) for other in others]

    def cross_aggregate(self, state, inbox, ctx):
        """b̄_g + U_g to every member; the next holder to the members and other leaders."""
        if "delta" not in state.extras:  # an empty group (cannot happen with task groups)
            return state, []
        ctx.held_by(state.extras["holder"])
        deltas = {ctx.index: state.extras.pop("delta")}
        deltas.update({index_of(m.src): m.tensors for m in inbox})
        began = time.perf_counter()
        backbone, weights = self.cross_group_backbone(state.extras.pop("group_mean"), deltas, ctx)
        members, holder = ctx.federation.members(ctx.index), state.extras["holder"]
        successor = next_holder(members, holder, ctx.seed, ctx.round, ctx.index)
        ctx.record(
            "leaders",
            group=ctx.index,
            leader=holder,
            next_leader=successor,
            members=len(members),
            failover=bool(state.extras.pop("failover", False)),
            aggregate_seconds=time.perf_counter() - began,
            weights=weights,
        )
        announce = {NEXT_LEADER: torch.tensor([successor])}
        update = {**backbone, **announce}  # one payload for all members: stored once
        outbox = [Message(ctx.me, client_name(i), "backbone_update", update) for i in members]
        others = [g for g in ctx.federation.task_groups() if g != ctx.index]
        outbox += [Message(ctx.me, leader_name(g), "leader_announce", announce) for g in others]
        return state, outbox

    def cross_group_backbone(self, group_mean, deltas, ctx) -> tuple[dict, list[float]]:
        """ColNet: b̄_g + U_g (or b_g⁰ + U_g), U_g = HCA over the groups' deltas in group order."""
        rows = torch.stack([flatten(deltas[g]) for g in sorted(deltas)])
        result = conflict_averse_update(rows, self.params.ca_c)
        update = unflatten(result.update, group_mean)
        own = deltas[ctx.index]
        from_start = self.params.hca_base == "round_start"
        backbone = {
            name: group_mean[name] - (own[name] if from_start else 0) + update[name]
            for name in group_mean
        }
        return backbone, [float(w) for w in result.weights]

    def note_leaders(self, state, inbox, ctx):
        """Who holds the other groups' leadership next round (where to send Δ)."""
        ctx.held_by(state.extras["holder"])
        leaders = state.extras.setdefault("peer_leaders", {})
        for message in inbox:
            leaders[index_of(message.src)] = int(message.tensors[NEXT_LEADER])
        return state, []


@register_algorithm
class FedPerIC(ColNet):
    name = "fedper_ic"
    combines_otherwise = "task leaders combine the groups' backbones by HCA (conflict-averse)"
    summary = "FedPer(I&C): backbones averaged within task groups, then plainly across groups"

    def cross_group_backbone(self, group_mean, deltas, ctx) -> tuple[dict, list[float]]:
        """Every group gets the plain mean of the group means: b⁰ + mean_g Δ_g."""
        own, order = deltas[ctx.index], sorted(deltas)  # a fixed order: the same float sums
        weight = 1.0 / len(deltas)
        backbone = {
            name: group_mean[name] - own[name] + sum(deltas[g][name] for g in order) * weight
            for name in group_mean
        }
        return backbone, [weight] * len(deltas)
