"""Ditto's client step with hand-computed values, its evaluation model and its bits."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raymtl.algorithms import get_algorithm
from raymtl.algorithms.base import (
    EVERY_CLIENT,
    FederationInfo,
    Message,
    State,
    StepContext,
    payload_bits,
)
from raymtl.algorithms.ditto import Ditto, DittoParams
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.training import model_tensors
from raymtl.data.client_data import ClientData
from raymtl.models import build_model


def linear() -> nn.Module:
    """Two logits from one feature, no bias: weight (2, 1)."""
    return nn.Linear(1, 2, bias=False)


def one_sample() -> ClientData:
    """x = 1, label 0: at logits z, ∇_W CE = (softmax(z) − e_0)·x."""
    x, y = torch.tensor([[1.0]]), torch.tensor([0])
    return ClientData(x, y, x, y, 2, (1, 1, 1))


def ctx(me: str, sampled=(0,), num_clients: int = 1) -> StepContext:
    federation = FederationInfo(num_clients, (1,) * num_clients, (2,) * num_clients, (1, 1, 1))
    return StepContext(me=me, round=1, rounds=1, seed=0, sampled=sampled, federation=federation)


def received(value: float) -> list[Message]:
    return [Message("server", "client/0", "global_model", {"weight": torch.full((2, 1), value)})]


def client(extras=None) -> State:
    return State(model=linear(), data=one_sample(), extras=dict(extras or {}))


def ditto(**params) -> Ditto:
    return Ditto(DittoParams(**params), model_factory=None)


def test_defaults_are_the_papers():
    params = DittoParams()
    assert params.lam == 0.1 and params.personal_lr is None and params.personal_epochs is None
    personal = params.personal()
    assert personal.lr == params.lr and personal.epochs == params.epochs
    assert DittoParams(lam=1.0, personal_lr=0.2, personal_epochs=3).personal().lr == 0.2
    with pytest.raises(ValidationError):
        DittoParams(lam=-0.1)
    assert Ditto.keeps == ("extras",) and get_algorithm("ditto") is Ditto


@pytest.mark.parametrize(
    ("lam", "expected"),
    [
        # v = 0: softmax = (½, ½), ∇f = (−½, ½); w = 1: λ(v − w) = (−λ, −λ)
        # v' = 0 − 0.1·((−½, ½) + (−1, −1)) = (0.15, 0.05)
        (1.0, [0.15, 0.05]),
        # v' = 0 − 0.1·((−½, ½) + (−0.1, −0.1)) = (0.06, −0.04)
        (0.1, [0.06, -0.04]),
    ],
)
def test_personal_step_is_sgd_on_the_proximal_objective(lam, expected):
    state = client({"personal": {"weight": torch.zeros(2, 1)}})
    state, outbox = ditto(lr=0.1, lam=lam, batch_size=1).train(
        state, received(1.0), ctx("client/0")
    )
    personal = state.extras["personal"]["weight"].flatten()
    torch.testing.assert_close(personal, torch.tensor(expected))
    # w: logits (1, 1), the same ∇f; w' = 1 − 0.1·(−½, ½) = (1.05, 0.95), sent to the server
    (message,) = outbox
    assert message.dst == "server"
    torch.testing.assert_close(message.tensors["weight"].flatten(), torch.tensor([1.05, 0.95]))


def test_personal_lr_and_epochs():
    # η_p = 0.2, λ = 1, two epochs of the one sample, from v = 0 towards w = 1:
    # step 1: v = −0.2·((−½, ½) + (−1, −1)) = (0.3, 0.1)
    # step 2: z = (0.3, 0.1), softmax_0 = σ(0.2) = 0.549834; ∇f = (−0.450166, 0.450166)
    #         v = (0.3, 0.1) − 0.2·((−0.450166, 0.450166) + (−0.7, −0.9)) = (0.530033, 0.189967)
    state = client({"personal": {"weight": torch.zeros(2, 1)}})
    params = dict(lr=0.1, lam=1.0, personal_lr=0.2, personal_epochs=2, batch_size=1)
    state, _ = ditto(**params).train(state, received(1.0), ctx("client/0"))
    personal = state.extras["personal"]["weight"].flatten()
    torch.testing.assert_close(personal, torch.tensor([0.530033, 0.189967]))


def test_first_personal_model_starts_at_the_received_global():
    # No v yet: v ← w = 1, so the proximal term is 0 and v takes w's step: (1.05, 0.95).
    state, _ = ditto(lr=0.1, batch_size=1).train(client(), received(1.0), ctx("client/0"))
    torch.testing.assert_close(
        state.extras["personal"]["weight"].flatten(), torch.tensor([1.05, 0.95])
    )


def test_lam_zero_is_local_training_of_v():
    # λ = 0: v ignores w; from v = 0, v' = −0.1·(−½, ½) = (0.05, −0.05)
    state = client({"personal": {"weight": torch.zeros(2, 1)}})
    state, _ = ditto(lr=0.1, lam=0.0, batch_size=1).train(state, received(5.0), ctx("client/0"))
    torch.testing.assert_close(
        state.extras["personal"]["weight"].flatten(), torch.tensor([0.05, -0.05])
    )


def test_global_part_is_fedavgs():
    torch.manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    data = ClientData(x, y, x, y, 10, (1, 8, 8))
    w = model_tensors(build_model("mlp", (1, 8, 8), 10))
    inbox = [Message("server", "client/0", "global_model", w)]
    sent = []
    for algorithm in (ditto(batch_size=4, lam=1.0), FedAvg(DittoParams(batch_size=4), None)):
        state = State(model=build_model("mlp", (1, 8, 8), 10), data=data)
        _, (message,) = algorithm.train(state, inbox, ctx("client/0"))
        sent.append(message.tensors)
    for name in w:
        torch.testing.assert_close(sent[0][name], sent[1][name], rtol=0, atol=0)


def test_evaluated_with_the_personal_model():
    algorithm = ditto()
    model = linear()
    assert algorithm.eval_model(State(model=model)) is model  # never trained: the global w
    personal = {"weight": torch.tensor([[2.0], [3.0]])}
    evaluated = algorithm.eval_model(State(model=model, extras={"personal": personal}))
    assert evaluated is not model
    torch.testing.assert_close(
        evaluated(torch.tensor([[1.0]])).detach(), torch.tensor([[2.0, 3.0]])
    )
    assert not torch.equal(model.weight.detach(), personal["weight"])  # w left as it was


def test_bits_per_round_are_fedavgs():
    model = build_model("mlp", (1, 8, 8), 10)
    size = sum(t.numel() for t in model.state_dict().values() if t.is_floating_point())
    algorithm = Ditto(DittoParams(), lambda participant, classes: build_model("mlp", (1, 8, 8), 10))
    federation = FederationInfo(4, (8,) * 4, (10,) * 4, (1, 8, 8))
    sampled = (1, 3)
    server = algorithm.init_state("server", None, federation)
    context = StepContext("server", 1, 1, 0, sampled, federation)
    _, down = algorithm.broadcast(server, [], context)
    assert [m.dst for m in down] == ["client/1", "client/3"]
    assert sum(payload_bits(m.tensors) for m in down) == len(sampled) * size * 32

    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    up = []
    for i in sampled:
        state = algorithm.init_state(f"client/{i}", ClientData(x, y, x, y, 10, (1, 8, 8)), None)
        me = StepContext(f"client/{i}", 1, 1, 0, sampled, federation)
        mine = [m for m in down if m.dst == f"client/{i}"]
        _, outbox = algorithm.train(state, mine, me)
        up += outbox
    assert sum(payload_bits(m.tensors) for m in up) == len(sampled) * size * 32

    _, copies = algorithm.aggregate(server, up, context)
    (copy,) = copies  # one evaluation copy to every client: not traffic
    assert copy.evaluation_only and copy.dst == EVERY_CLIENT
