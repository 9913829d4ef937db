"""ColNet's steps on hand-made tensors: intra-group mean, Δ_g, the leader's update, rotation."""

from __future__ import annotations

import pytest
import torch

from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.algorithms.colnet import first_holder, flatten, next_holder, unflatten
from raymtl.algorithms.registry import get_algorithm

# Clients 0, 1 solve task 0 and clients 2, 3 task 1.
FEDERATION = FederationInfo(4, (10, 10, 10, 10), (2, 2, 3, 3), (1, 2, 2), tasks=(0, 0, 1, 1))


def make(name: str):
    cls = get_algorithm(name)
    return cls(cls.Params(), model_factory=None)


def context(me: str, round_index: int = 1) -> StepContext:
    return StepContext(me, round_index, 5, 0, (0, 1, 2, 3), FEDERATION)


def backbone(*values: float) -> dict[str, torch.Tensor]:
    return {"backbone.w": torch.tensor(values, dtype=torch.float32)}


def hand_off(src: str, dst: str, mean, start) -> list[Message]:
    return [
        Message(src, dst, "group_backbone", backbone(*mean)),
        Message(src, dst, "round_start", backbone(*start)),
    ]


def test_leader_computes_delta_and_sends_it_to_the_other_leaders_only():
    colnet, ctx = make("colnet"), context("leader/0")
    state, outbox = colnet.cross_exchange(
        State(), hand_off("client/1", "leader/0", (3, 1), (1, 1)), ctx
    )
    assert [(m.dst, m.kind) for m in outbox] == [("leader/1", "delta")]
    assert torch.equal(outbox[0].tensors["backbone.w"], torch.tensor([2.0, 0.0]))  # b̄ − b⁰
    assert ctx.holders == {"leader/0": 1}


def test_colnet_leader_sends_group_mean_plus_hca_update_to_every_member():
    """Orthogonal unit deltas: w* = (½, ½), U = (g0 + c·G_w/‖G_w‖)/(1 + 0.4²) = 0.7/1.16·(1, 1)."""
    colnet = make("colnet")
    state, _ = colnet.cross_exchange(
        State(), hand_off("client/0", "leader/0", (2, 0), (1, 0)), context("leader/0")
    )
    inbox = [Message("leader/1", "leader/0", "delta", backbone(0, 1))]
    ctx = context("leader/0")
    state, outbox = colnet.cross_aggregate(state, inbox, ctx)
    updates = [m for m in outbox if m.kind == "backbone_update"]
    assert [m.dst for m in updates] == ["client/0", "client/1"]
    expected = torch.tensor([2.0, 0.0]) + 0.7 / 1.16 * torch.ones(2)
    assert torch.allclose(updates[0].tensors["backbone.w"], expected, atol=1e-5)
    assert int(updates[0].tensors["next_leader"]) == 1  # the only other member
    (announce,) = [m for m in outbox if m.kind == "leader_announce"]
    assert announce.dst == "leader/1" and int(announce.tensors["next_leader"]) == 1
    (row,) = [r for table, r in ctx.records if table == "leaders"]
    assert row["leader"] == 0 and row["weights"] == pytest.approx([0.5, 0.5], abs=1e-4)


def test_fedper_ic_gives_every_group_the_plain_mean_of_the_group_means():
    fedper = make("fedper_ic")
    state, _ = fedper.cross_exchange(
        State(), hand_off("client/2", "leader/1", (5, 1), (1, 1)), context("leader/1")
    )
    inbox = [Message("leader/0", "leader/1", "delta", backbone(2, 0))]  # group 0's mean: (3, 1)
    _, outbox = fedper.cross_aggregate(state, inbox, context("leader/1"))
    (update,) = [m for m in outbox if m.dst == "client/2"]
    assert torch.allclose(update.tensors["backbone.w"], torch.tensor([4.0, 1.0]))  # ((5,1)+(3,1))/2


def test_members_average_backbones_with_equal_weights_and_only_the_holder_hands_off():
    from raymtl.models import build_model

    colnet = make("colnet")
    model = build_model("mlp", (1, 2, 2), 2)
    state = State(model=model, extras={"holder": 0, "round_start": {}})
    own = {n: t.clone() for n, t in model.state_dict().items() if n.startswith("backbone.")}
    assert own  # the MLP's hidden layer is its backbone
    peer = {n: t + 2.0 for n, t in own.items()}
    inbox = [Message("client/1", "client/0", "backbone", peer)]
    state, outbox = colnet.intra_average(state, inbox, context("client/0"))
    for name, tensor in own.items():
        assert torch.allclose(model.state_dict()[name], tensor + 1.0)
    assert [(m.dst, m.kind) for m in outbox] == [
        ("leader/0", "group_backbone"),
        ("leader/0", "round_start"),
    ]
    state.extras["holder"] = 1
    assert colnet.intra_average(state, inbox, context("client/0"))[1] == []


def test_the_last_round_trains_only():
    for name in ("colnet", "fedper_ic", "intra_group"):
        assert [p.step for p in make(name).phases(5, 5)] == ["train"]
    assert [p.role for p in make("colnet").phases(1, 5)] == [
        "client",
        "client",
        "leader",
        "leader",
        "leader",
        "client",
    ]


def test_leadership_passes_to_another_member_deterministically():
    members = [3, 5, 8]
    for round_index in range(1, 20):
        chosen = next_holder(members, 5, seed=0, round_index=round_index, group=1)
        assert chosen in (3, 8)
        assert chosen == next_holder(members, 5, seed=0, round_index=round_index, group=1)
    assert next_holder([4], 4, 0, 1, 0) == 4
    assert first_holder(members, 0, 1) in members


def test_flatten_and_unflatten_round_trip():
    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.tensor([7.0])}
    vector = flatten(tensors)
    assert vector.tolist() == [7.0, 0, 1, 2, 3, 4, 5]  # name order
    back = unflatten(vector, tensors)
    assert all(torch.equal(back[n], tensors[n]) for n in tensors)


def test_hca_base_round_start_adds_the_update_to_the_start_of_the_round():
    cls = get_algorithm("colnet")
    colnet = cls(cls.Params(hca_base="round_start"), model_factory=None)
    handed = hand_off("client/0", "leader/0", (2, 0), (1, 0))
    state, _ = colnet.cross_exchange(State(), handed, context("leader/0"))
    inbox = [Message("leader/1", "leader/0", "delta", backbone(0, 1))]
    _, outbox = colnet.cross_aggregate(state, inbox, context("leader/0"))
    expected = torch.tensor([1.0, 0.0]) + 0.7 / 1.16 * torch.ones(2)  # b⁰ + U
    assert torch.allclose(outbox[0].tensors["backbone.w"], expected, atol=1e-5)
