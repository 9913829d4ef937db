"""FedRep steps with hand-computed values, its refusal and its bits (docs/ALGORITHMS.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from raymtl.algorithms.base import EVERY_CLIENT, FederationInfo, Message, State, StepContext
from raymtl.algorithms.fedrep import FedRep, FedRepParams, fedrep_train
from raymtl.models import build_model
from raymtl.tasks.spec import TaskSpec

MSE = TaskSpec(name="value", targets="value", loss="mse", outputs=1, metrics=("mse", "mae"))


class Tiny(nn.Module):
    """f(x) = h·(b·x): a one-weight body and a one-weight head."""

    def __init__(self, b: float = 1.0, h: float = 1.0):
        super().__init__()
        self.backbone = nn.Linear(1, 1, bias=False)
        self.head = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.backbone.weight.fill_(b)
            self.head.weight.fill_(h)

    def forward(self, x):
        return self.head(self.backbone(x))


def one_sample(x: float = 1.0, y: float = 3.0):
    return SimpleNamespace(
        train_x=torch.tensor([[x]]), train_y=torch.tensor([[y]]), task=MSE, num_classes=1
    )


def ctx(me: str, samples=(1, 3), sampled=(0, 1)) -> StepContext:
    federation = FederationInfo(len(samples), tuple(samples), (1,) * len(samples), (1, 1, 1))
    return StepContext(me=me, round=1, rounds=1, seed=0, sampled=sampled, federation=federation)


def weight(model: nn.Module, part: str) -> float:
    return float(getattr(model, part).weight.detach())


def test_head_epochs_then_body_epochs_on_a_tiny_linear_model():
    model, params = Tiny(), FedRepParams(head_epochs=2, epochs=1, lr=0.1, batch_size=1)
    head_loss, body_loss = fedrep_train(model, one_sample(), params, seed=0)
    # loss (h·b·x − y)², x = 1, y = 3, b = h = 1. Head, b fixed: ∂/∂h = 2(hb − 3)·b
    #   h = 1 − 0.1·2(1 − 3) = 1.4;  h = 1.4 − 0.1·2(1.4 − 3) = 1.72   (losses 4, 2.56)
    # Body, h = 1.72 fixed: ∂/∂b = 2(hb − 3)·h = 2(−1.28)(1.72) = −4.4032;  b = 1.44032
    assert weight(model, "head") == pytest.approx(1.72)
    assert weight(model, "backbone") == pytest.approx(1.44032)
    assert head_loss == pytest.approx((4 + 2.56) / 2)
    assert body_loss == pytest.approx(1.28**2)
    assert all(p.requires_grad for p in model.parameters())  # the freezing is undone


def test_client_step_loads_the_body_keeps_its_head_and_sends_the_body_only():
    algorithm = FedRep(FedRepParams(head_epochs=1, epochs=1, lr=0.1, batch_size=1), None)
    state = State(model=Tiny(b=5.0, h=1.0), data=one_sample())  # its own body is stale: b = 5
    inbox = [Message("server", "client/0", "body", {"backbone.weight": torch.tensor([[1.0]])})]
    state, outbox = algorithm.train(state, inbox, ctx("client/0"))
    # b = 1 (received); h = 1 − 0.1·2(1 − 3)·1 = 1.4; b = 1 − 0.1·2(1.4 − 3)·1.4 = 1.448
    assert weight(state.model, "head") == pytest.approx(1.4)
    [message] = outbox
    assert (message.dst, message.kind, list(message.tensors)) == (
        "server",
        "body",
        ["backbone.weight"],
    )
    assert float(message.tensors["backbone.weight"]) == pytest.approx(1.448)


def test_server_averages_the_bodies_by_samples_and_sends_the_body_to_all_for_evaluation():
    algorithm = FedRep(FedRepParams(), None)
    server = State(model=Tiny(b=0.0, h=7.0))
    inbox = [
        Message(f"client/{k}", "server", "body", {"backbone.weight": torch.tensor([[v]])})
        for k, v in ((1, 4.0), (0, 1.0))
    ]
    server, outbox = algorithm.aggregate(server, inbox, ctx("server", samples=(1, 3, 2)))
    # φ = (1·1 + 3·4) / (1 + 3) = 3.25; the server's head is no part of it
    assert weight(server.model, "backbone") == 3.25 and weight(server.model, "head") == 7.0
    assert [m.dst for m in outbox] == [EVERY_CLIENT]  # one copy, every client's
    assert all(m.evaluation_only and list(m.tensors) == ["backbone.weight"] for m in outbox)
    assert {float(m.tensors["backbone.weight"]) for m in outbox} == {3.25}


def test_bits_per_round_are_the_body_down_and_up_for_the_sampled_clients():
    model = build_model("mlp", (1, 8, 8), 10)
    body = sum(t.numel() for n, t in model.state_dict().items() if n.startswith("backbone."))
    algorithm = FedRep(FedRepParams(head_epochs=1), None)
    sampled = (0, 2)
    _, down = algorithm.broadcast(State(model=model), [], ctx("server", (5, 5, 5), sampled))
    assert [m.dst for m in down] == ["client/0", "client/2"]
    assert sum(t.numel() * 32 for m in down for t in m.tensors.values()) == len(sampled) * body * 32
    data = SimpleNamespace(
        train_x=torch.randn(5, 1, 8, 8), train_y=torch.arange(5), task=None, num_classes=10
    )
    _, up = algorithm.train(State(model=model, data=data), down[:1], ctx("client/0"))
    assert sum(t.numel() * 32 for m in up for t in m.tensors.values()) == body * 32
    assert all(t.dtype == torch.float32 for m in down + up for t in m.tensors.values())


def test_a_model_without_a_head_is_refused_in_one_line():
    algorithm = FedRep(FedRepParams(), lambda participant, classes: nn.Linear(2, classes))
    data = SimpleNamespace(num_classes=3)
    with pytest.raises(ValueError, match="body/head split") as error:
        algorithm.init_state("client/0", data, ctx("client/0").federation)
    assert "\n" not in str(error.value)


def test_paper_defaults():
    p = FedRepParams()
    assert (p.head_epochs, p.epochs, p.lr, p.batch_size, p.sample_fraction) == (
        10,
        1,
        0.01,
        10,
        0.1,
    )
    assert (FedRep.task_support, FedRep.model_support, FedRep.keeps) == (
        "different",
        "same",
        ("model",),
    )
