"""IFCA's steps with hand-computed values: the pick, one local step, the cluster-wise
average, and the bits of a round against (|S_t| + N)·K·|θ|·32 down, |S_t|·(|θ|·32 + 64) up."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from raymtl.algorithms.base import (
    SERVER,
    FederationInfo,
    Message,
    State,
    StepContext,
    payload_bits,
)
from raymtl.algorithms.ifca import (
    EVAL_KIND,
    IFCA,
    IFCAParams,
    initial_clusters,
    pack,
    pick_cluster,
    unpack,
)


def federation(samples=(1, 3, 1), groups=(0, 1, 0)) -> FederationInfo:
    n = len(samples)
    return FederationInfo(n, samples, (2,) * n, (1, 1, 1), tasks=(0,) * n, groups=groups)


def ctx(me: str, sampled=(0, 1, 2), fed: FederationInfo | None = None) -> StepContext:
    fed = fed or federation()
    return StepContext(me=me, round=1, rounds=1, seed=0, sampled=sampled, federation=fed)


def linear(weight) -> nn.Module:
    model = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight))
    return model


def one_sample() -> SimpleNamespace:
    """x = 1, label 0: a 2-class linear model W gives logits W·x = W[:, 0]."""
    return SimpleNamespace(
        train_x=torch.tensor([[1.0]]), train_y=torch.tensor([0]), task=None, num_classes=2
    )


def test_the_pick_is_the_lowest_loss_lowest_index_on_ties_never_non_finite():
    assert pick_cluster([0.5, 0.2, 0.9]) == 1
    assert pick_cluster([0.3, 0.2, 0.2]) == 1  # tie: the lowest j
    assert pick_cluster([float("nan"), 0.7, float("inf")]) == 1
    assert pick_cluster([float("nan"), float("nan")]) == 0


def test_initial_clusters_differ_but_keep_the_init_values():
    init = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.zeros(3)}
    models = initial_clusters(init, 3, seed=7)
    assert len(models) == 3 and torch.equal(models[0]["w"], init["w"])
    for model in models[1:]:
        assert not torch.equal(model["w"], init["w"])  # another starting point
        assert torch.equal(model["w"].flatten().sort().values, init["w"].flatten())  # same values
        assert torch.equal(model["b"], init["b"])
    assert not torch.equal(models[1]["w"], models[2]["w"])
    again = initial_clusters(init, 3, seed=7)  # seeded
    assert all(torch.equal(a["w"], b["w"]) for a, b in zip(models, again, strict=True))
    assert [list(m) for m in unpack(pack(models))] == [list(m) for m in models]


def test_a_sampled_client_trains_the_cluster_of_lowest_loss_and_says_which():
    algorithm = IFCA(IFCAParams(clusters=2, lr=0.1, batch_size=1), model_factory=None)
    state = State(model=linear([[5.0], [5.0]]), data=one_sample())
    models = [{"weight": torch.zeros(2, 1)}, {"weight": torch.tensor([[1.0], [0.0]])}]
    inbox = [Message(SERVER, "client/0", "cluster_models", pack(models))]
    context = ctx("client/0")
    state, outbox = algorithm.train(state, inbox, context)
    # f(θ_0) = ln 2 = 0.693; f(θ_1) = −log(e/(e+1)) = log(1 + e⁻¹) = 0.313 → ĵ = 1.
    # One SGD step from W = [1, 0]: p = softmax([1, 0]) = [σ, 1−σ], σ = e/(e+1) = 0.7311;
    # ∇W = (p − e_0)·x = [σ−1, 1−σ]; W ← W − 0.1·∇W = [1 + 0.1·(1−σ), −0.1·(1−σ)]
    step = 0.1 * (1 - math.e / (math.e + 1))
    (message,) = outbox
    assert message.dst == SERVER and int(message.tensors["cluster"]) == 1
    assert message.tensors["cluster"].dtype == torch.int64
    torch.testing.assert_close(message.tensors["weight"], torch.tensor([[1 + step], [-step]]))
    assert payload_bits(message.tensors) == 2 * 32 + 64  # |θ|·32 + ĵ as int64
    assert state.extras["cluster"] == 1
    (row,) = context.records
    assert row[0] == "ifca_clusters" and row[1]["cluster"] == 1 and row[1]["stage"] == "train"
    assert row[1]["client"] == 0 and row[1]["group"] == 0
    assert row[1]["loss"] == pytest.approx(math.log(1 + math.exp(-1)))


def test_the_server_averages_per_cluster_and_keeps_an_unpicked_cluster():
    algorithm = IFCA(IFCAParams(clusters=3), model_factory=None)
    server = State(model=nn.Linear(1, 1, bias=False))
    server.extras["clusters"] = [{"weight": torch.tensor([[v]])} for v in (0.0, 10.0, 20.0)]

    def upload(client: int, value: float, cluster: int) -> Message:
        tensors = {"weight": torch.tensor([[value]]), "cluster": torch.tensor([cluster])}
        return Message(f"client/{client}", SERVER, "model", tensors)

    inbox = [upload(2, 7.0, 2), upload(1, 4.0, 0), upload(0, 2.0, 0)]  # n = (1, 3, 1)
    server, outbox = algorithm.aggregate(server, inbox, ctx(SERVER))
    # cluster 0: (1·2 + 3·4) / (1 + 3) = 3.5; cluster 1: nobody picked it, 10; cluster 2: 7
    new = [float(m["weight"]) for m in server.extras["clusters"]]
    assert new == pytest.approx([3.5, 10.0, 7.0])
    assert [m.dst for m in outbox] == ["client/0", "client/1", "client/2"]  # every client
    assert all(m.kind == EVAL_KIND and not m.evaluation_only for m in outbox)  # counted
    assert [float(v) for v in outbox[0].tensors.values()] == pytest.approx([3.5, 10.0, 7.0])


def test_a_client_is_evaluated_with_the_cluster_of_lowest_training_loss():
    algorithm = IFCA(IFCAParams(clusters=2), model_factory=None)
    state = State(model=linear([[0.0], [0.0]]), data=one_sample())
    models = [{"weight": torch.tensor([[0.0], [2.0]])}, {"weight": torch.tensor([[2.0], [0.0]])}]
    context = ctx("client/1")
    state, outbox = algorithm.choose(
        state, [Message(SERVER, "client/1", EVAL_KIND, pack(models))], context
    )
    assert outbox == [] and state.extras["cluster"] == 1  # logits [2, 0] for label 0
    assert torch.equal(algorithm.eval_model(state).weight.detach(), models[1]["weight"])
    (row,) = context.records
    assert row[1] == {
        "client": 1,
        "cluster": 1,
        "stage": "eval",
        "group": 1,
        "task": 0,
        "loss": pytest.approx(math.log(1 + math.exp(-2))),
    }


def test_one_round_sends_the_bits_of_the_formula():
    k, sampled, n = 3, (0, 2), 3
    factory = lambda participant, classes: nn.Linear(1, classes)  # noqa: E731
    algorithm = IFCA(IFCAParams(clusters=k, lr=0.1), model_factory=factory)
    fed = federation()
    server = algorithm.init_state(SERVER, None, fed)
    theta = sum(p.numel() for p in server.model.parameters())  # |θ| = 2·1 + 2
    server, down = algorithm.broadcast(server, [], ctx(SERVER, sampled, fed))
    assert [m.dst for m in down] == ["client/0", "client/2"]
    up = []
    for message in down:
        client = algorithm.init_state(message.dst, one_sample(), fed)
        _, outbox = algorithm.train(client, [message], ctx(message.dst, sampled, fed))
        up += outbox
    server, evaluation = algorithm.aggregate(server, up, ctx(SERVER, sampled, fed))
    bits_down = sum(payload_bits(m.tensors) for m in down + evaluation)
    bits_up = sum(payload_bits(m.tensors) for m in up)
    assert bits_down == (len(sampled) + n) * k * theta * 32
    assert bits_up == len(sampled) * (theta * 32 + 64)


def test_no_evaluation_downlink_after_a_round_that_is_not_evaluated():
    algorithm = IFCA(IFCAParams(clusters=2), model_factory=None)
    server = State(model=nn.Linear(1, 1, bias=False))
    server.extras["clusters"] = [{"weight": torch.tensor([[v]])} for v in (0.0, 10.0)]
    upload = {"weight": torch.tensor([[4.0]]), "cluster": torch.tensor([1])}
    context = dataclasses.replace(ctx(SERVER), evaluated=False)  # eval_every > 1
    server, outbox = algorithm.aggregate(
        server, [Message("client/1", SERVER, "model", upload)], context
    )
    assert outbox == []  # nothing to pick: the K models stay on the server
    assert [float(m["weight"]) for m in server.extras["clusters"]] == [0.0, 4.0]
