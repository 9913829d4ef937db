"""SFMTL-Graph maths with hand-computed values (docs/ALGORITHMS.md §9)."""

from __future__ import annotations

import math

import pytest
import torch

from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.algorithms.fedu import laplacian_step
from raymtl.algorithms.sfmtl_graph import (
    AnchorTraining,
    SFMTLGraph,
    SFMTLGraphParams,
    anchor_loss,
    community_anchors,
    initial_anchor,
)
from raymtl.graph.similarity import ClientView, pair_similarity, similarity_graph


def view(weight, anchors, bias=None) -> ClientView:
    weight = torch.tensor(weight, dtype=torch.float32)
    bias = torch.zeros(weight.shape[0]) if bias is None else torch.tensor(bias)
    return ClientView(weight, bias, {c: torch.tensor(v, dtype=torch.float32) for c, v in anchors})


def test_fs_and_as_on_hand_made_heads_and_anchors():
    a = view([[1, 0], [0, 1]], [(0, [1, 0]), (1, [0, 1])])
    b = view([[1, 0], [1, 1]], [(0, [1, 1])])  # shares class 0 only
    s, fs, as_ = pair_similarity(a, b, alpha=0.49)
    # A_a[0] = (1,0): h_a -> (1,0), h_b -> (1,1): cos = 1/√2
    # A_b[0] = (1,1): h_a -> (1,1), h_b -> (1,2): cos = 3/√10
    assert fs == pytest.approx(0.5 * (1 / math.sqrt(2) + 3 / math.sqrt(10)), abs=1e-6)
    assert as_ == pytest.approx(1 / math.sqrt(2), abs=1e-6)
    assert s == pytest.approx(0.49 * fs + 0.51 * as_, abs=1e-6)


def test_no_shared_class_gives_zero():
    a = view([[1, 0], [0, 1]], [(0, [1, 0])])
    b = view([[1, 0], [0, 1]], [(1, [1, 0])])
    assert pair_similarity(a, b, 0.49) == (0.0, 0.0, 0.0)


def test_negative_similarity_is_clipped_to_zero():
    a = view([[1, 0], [0, 1]], [(0, [1, 0])])
    b = view([[1, 0], [0, 1]], [(0, [-1, 0])])
    s, fs, as_ = pair_similarity(a, b, 0.49)
    # FS = ½(cos((1,0),(1,0)) + cos((-1,0),(-1,0))) = 1, AS = -1: 0.49 - 0.51 < 0
    assert (fs, as_) == (pytest.approx(1.0), pytest.approx(-1.0))
    assert s == 0.0


def test_similarity_graph_is_symmetric_with_zero_diagonal():
    views = {
        3: view([[1, 0], [0, 1]], [(0, [1, 0])]),
        1: view([[1, 0], [0, 1]], [(0, [1, 1])]),
    }
    graph = similarity_graph(views, 0.49)
    assert graph.clients == (1, 3)
    assert graph.s[0, 1] == graph.s[1, 0] > 0 and graph.s[0, 0] == 0


def test_head_update_two_clients():
    heads = {1: {"w": torch.tensor([1.0])}, 2: {"w": torch.tensor([3.0])}}
    new = laplacian_step(heads, {1: {2: 0.5}, 2: {1: 0.5}}, step=0.1)
    assert float(new[1]["w"]) == pytest.approx(1.1)  # 1 - 0.1·0.5·(1-3)
    assert float(new[2]["w"]) == pytest.approx(2.9)
    assert float(heads[1]["w"]) == 1.0  # inputs untouched


def test_head_update_three_clients_is_simultaneous():
    heads = {i: {"w": torch.tensor([v])} for i, v in ((1, 0.0), (2, 1.0), (3, 3.0))}
    s = {1: {2: 1.0, 3: 0.5}, 2: {1: 1.0, 3: 0.2}, 3: {1: 0.5, 2: 0.2}}
    new = laplacian_step(heads, s, step=0.1)
    assert float(new[1]["w"]) == pytest.approx(0.25)  # 0 - 0.1·(1·(0-1) + 0.5·(0-3))
    assert float(new[2]["w"]) == pytest.approx(0.94)  # sequential (after h1=0.25) gives 0.965
    assert float(new[3]["w"]) == pytest.approx(2.81)  # 3 - 0.1·(0.5·3 + 0.2·2)


def test_community_anchor_weighting():
    anchors = {
        1: {0: torch.tensor([1.0, 0.0]), 1: torch.tensor([2.0, 2.0])},
        2: {0: torch.tensor([0.0, 1.0])},
        3: {0: torch.tensor([5.0, 5.0])},
    }
    means = community_anchors(anchors, {1: 0, 2: 0, 3: 1}, samples=(9, 1, 3, 7))
    assert torch.allclose(means[0][0], torch.tensor([0.25, 0.75]))  # (1·(1,0) + 3·(0,1)) / 4
    assert torch.allclose(means[0][1], torch.tensor([2.0, 2.0]))  # only client 1 holds class 1
    assert torch.allclose(means[1][0], torch.tensor([5.0, 5.0]))


def test_anchor_loss_by_hand():
    features = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    anchor = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # distances 0, 4, 1; n_0 = 2, n_1 = 1; C = 2: (0/2 + 4/2 + 1/1) / 2
    assert float(anchor_loss(features, y, anchor)) == pytest.approx(1.5)


def test_ema_anchor_refresh_commits_at_the_end_of_each_epoch():
    params = SFMTLGraphParams(anchor_momentum=0.5)
    start = torch.zeros(3, 2)
    start[2] = torch.tensor([7.0, 7.0])
    training = AnchorTraining(start, [0, 1], params, batches_per_epoch=2)
    training.refresh(torch.tensor([[2.0, 0.0], [4.0, 0.0]]), torch.tensor([0, 0]))
    assert torch.equal(training.anchor, start)  # not before the epoch ends
    assert torch.allclose(training.ema[0], torch.tensor([1.5, 0.0]))  # 0.5·0 + 0.5·(3,0)
    training.refresh(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1]))
    expected = torch.tensor([[1.25, 0.0], [0.0, 1.0], [7.0, 7.0]])  # class 2 ∉ Y_i: kept
    assert torch.allclose(training.anchor, expected)
    assert torch.allclose(training.ema, expected)  # the next epoch starts from A


def test_initial_anchor_is_seeded_and_normalised():
    a, b = initial_anchor(10, 16, seed=3), initial_anchor(10, 16, seed=3)
    assert torch.equal(a, b)
    assert torch.allclose(a.norm(dim=1), torch.ones(10))
    assert not torch.equal(a, initial_anchor(10, 16, seed=4))


def fake_ctx(me: str, sampled=(0, 1, 2)) -> StepContext:
    federation = FederationInfo(3, (1, 3, 1), (2, 2, 2), (1, 1, 1))
    return StepContext(me=me, round=1, rounds=1, seed=0, sampled=sampled, federation=federation)


def upload(head: float, anchor: list[float], classes: list[int]) -> dict:
    return {
        "head.fc.weight": torch.tensor([[head]]),
        "head.fc.bias": torch.tensor([0.0]),
        "anchor": torch.tensor([anchor] * len(classes)),
        "classes": torch.tensor(classes, dtype=torch.int32),
    }


def test_server_aggregate_restricts_the_update_to_the_community():
    algorithm = SFMTLGraph(SFMTLGraphParams(lr=0.1, epochs=2, lam=0.5), model_factory=None)
    uploads = {0: upload(0.0, [1.0], [0]), 1: upload(2.0, [3.0], [0]), 2: upload(9.0, [9.0], [1])}
    state = State(extras={"uploads": uploads})
    result = {
        "clients": torch.tensor([0, 1, 2], dtype=torch.int32),
        "community": torch.tensor([0, 0, 1], dtype=torch.int32),
        "similarity": torch.tensor([[0, 0.5, 0.9], [0.5, 0, 0.9], [0.9, 0.9, 0]]),
    }
    inbox = [Message("graph", "server", "communities", result)]
    state, outbox = algorithm.aggregate(state, inbox, fake_ctx("server"))
    replies = {m.dst: m.tensors for m in outbox}
    # η_g·λ = 0.1·2·0.5 = 0.1: h_0 = 0 - 0.1·0.5·(0-2) = 0.1, h_1 = 2 - 0.1·0.5·2 = 1.9
    assert float(replies["client/0"]["head.fc.weight"]) == pytest.approx(0.1)
    assert float(replies["client/1"]["head.fc.weight"]) == pytest.approx(1.9)
    assert float(replies["client/2"]["head.fc.weight"]) == pytest.approx(9.0)  # alone
    # Ā = (1·1 + 3·3) / 4 = 2.5 for both members (n_0 = 1, n_1 = 3)
    assert float(replies["client/0"]["anchor"]) == pytest.approx(2.5)
    assert float(replies["client/2"]["anchor"]) == pytest.approx(9.0)
    assert "uploads" not in state.extras
