"""FedProx steps with hand-computed values (docs/ALGORITHMS.md, FedProx)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raymtl.algorithms import get_algorithm
from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.fedprox import (
    FedProx,
    FedProxParams,
    full_steps,
    proximal_term,
    straggler_steps,
    stragglers,
)
from raymtl.data.client_data import ClientData
from raymtl.models import build_model
from raymtl.tasks.spec import TaskSpec

MSE = TaskSpec(name="y", targets="y", loss="mse", outputs=1, metrics=("mse",))


def ctx(me: str, sampled=(0,), round_index: int = 1, seed: int = 0) -> StepContext:
    n = max(sampled) + 1
    federation = FederationInfo(n, (2,) * n, (1,) * n, (1, 1, 1))
    return StepContext(me, round_index, 10, seed, tuple(sampled), federation)


def regression_client(samples: int = 2) -> State:
    """w·x on x = 1, y = 0 (every sample alike, so the batch order does not matter):
    f(w) = w², ∇f(w) = 2w."""
    x, y = torch.ones(samples, 1), torch.zeros(samples, 1)
    data = ClientData(x, y, x, y, 1, (1, 1, 1), task=MSE)
    return State(model=nn.Linear(1, 1, bias=False), data=data)


def weight(value: float) -> list[Message]:
    return [Message("server", "client/0", "global_model", {"weight": torch.tensor([[value]])})]


def trained(algorithm, state: State, me: str = "client/0", **context) -> float:
    _, outbox = algorithm.train(state, weight(1.0), ctx(me, **context))
    return float(outbox[0].tensors["weight"])


def test_local_steps_add_mu_times_the_distance_to_the_global_model():
    # w^t = 1, η = 0.1, μ = 1; 2 samples in one batch, E = 2: two full-batch steps.
    params = FedProxParams(lr=0.1, mu=1.0, epochs=2, batch_size=2)
    # step 1: w = 1 − 0.1·(2·1 + 1·(1 − 1)) = 0.8
    # step 2: w = 0.8 − 0.1·(2·0.8 + 1·(0.8 − 1)) = 0.8 − 0.14 = 0.66
    assert trained(FedProx(params, None), regression_client()) == pytest.approx(0.66)
    # μ = 0 is FedAvg's step: 0.8 − 0.1·1.6 = 0.64
    plain = FedProxParams(lr=0.1, mu=0.0, epochs=2, batch_size=2)
    assert trained(FedProx(plain, None), regression_client()) == pytest.approx(0.64)


def test_proximal_term_is_half_mu_squared_distance_over_parameters():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 3.0]]))
        model.bias.fill_(-1.0)
    anchor = {"weight": torch.tensor([[0.0, 1.0]]), "bias": torch.tensor([1.0])}
    term = proximal_term(model, anchor, mu=0.5)
    assert float(term.detach()) == pytest.approx(0.25 * (1 + 4 + 4))  # μ/2·(1² + 2² + (−2)²)
    term.backward()  # ∇ = μ·(w − w^t)
    torch.testing.assert_close(model.weight.grad, torch.tensor([[0.5, 1.0]]))
    torch.testing.assert_close(model.bias.grad, torch.tensor([-1.0]))


def test_mu_zero_without_stragglers_trains_exactly_as_fedavg():
    torch.manual_seed(0)
    x, y = torch.randn(20, 1, 1, 2), torch.randint(0, 2, (20,))
    data = ClientData(x, y, x, y, 2, (1, 1, 2))
    start = build_model("logreg", (1, 1, 2), 2).state_dict()
    inbox = [Message("server", "client/0", "global_model", dict(start))]
    outputs = []
    for algorithm in (
        FedProx(FedProxParams(mu=0.0, epochs=2, batch_size=4), None),
        FedAvg(FedAvg.Params(epochs=2, batch_size=4), None),
    ):
        state = State(model=build_model("logreg", (1, 1, 2), 2), data=data)
        _, outbox = algorithm.train(state, inbox, ctx("client/0"))
        outputs.append(outbox[0].tensors)
    for name, value in outputs[0].items():
        assert torch.equal(value, outputs[1][name]), name


def test_straggler_count_is_nearest_share_of_the_sampled_and_seeded_per_round():
    sampled = tuple(range(10))
    for fraction, count in ((0.0, 0), (0.3, 3), (0.25, 3), (0.24, 2), (1.0, 10)):
        chosen = stragglers(ctx("client/0", sampled), fraction)
        assert len(chosen) == count and chosen <= set(sampled)
    # the same draw whoever asks (it names no client), another one in another round
    here = stragglers(ctx("client/3", sampled), 0.5)
    assert here == stragglers(ctx("client/7", sampled), 0.5)
    draws = {stragglers(ctx("client/0", sampled, round_index=t), 0.5) for t in range(1, 9)}
    assert len(draws) > 1
    assert stragglers(ctx("client/0", (4,)), 0.5) == {4}  # ⌊0.5·1 + ½⌋ = 1


def test_straggler_steps_lie_in_one_to_full_work_exclusive():
    assert full_steps(10, FedProxParams(epochs=3, batch_size=4)) == 9  # 3·⌈10/4⌉
    draws = [
        straggler_steps(ctx(f"client/{k}", round_index=t), 9) for k in range(5) for t in (1, 2)
    ]
    assert all(1 <= s <= 8 for s in draws) and len(set(draws)) > 1
    assert straggler_steps(ctx("client/0"), 9) == straggler_steps(ctx("client/0"), 9)
    assert straggler_steps(ctx("client/0"), 1) == 1  # T = 1: one step is all there is


def test_a_straggler_runs_its_drawn_steps_and_still_sends_its_model():
    # 2 samples, batch 1, E = 2: T = 4 steps, each w ← w − η·(2w + μ·(w − 1)).
    params = FedProxParams(lr=0.1, mu=1.0, epochs=2, batch_size=1, straggler_fraction=1.0)
    context = ctx("client/0")
    steps = straggler_steps(context, full_steps(2, params))
    assert 1 <= steps <= 3
    state = regression_client()
    _, outbox = FedProx(params, None).train(state, weight(1.0), context)
    expected = 1.0
    for _ in range(steps):
        expected -= 0.1 * (2 * expected + 1.0 * (expected - 1.0))
    assert [m.dst for m in outbox] == ["server"]  # the partial update is sent (and averaged)
    assert float(outbox[0].tensors["weight"]) == pytest.approx(expected)
    assert context.records == [("fedprox_work", {"client": 0, "straggler": True, "steps": steps})]
    full = 1.0
    for _ in range(4):
        full -= 0.1 * (2 * full + 1.0 * (full - 1.0))
    assert expected != pytest.approx(full)


def test_bits_per_round_are_fedavgs():
    model = build_model("logreg", (1, 1, 2), 2)
    size = sum(t.numel() for t in model.state_dict().values() if t.is_floating_point())
    algorithm = get_algorithm("fedprox")(
        FedProxParams(), lambda p, c: build_model("logreg", (1, 1, 2), c)
    )
    federation = FederationInfo(3, (4, 4, 4), (2, 2, 2), (1, 1, 2))
    server = algorithm.init_state("server", None, federation)
    context = StepContext("server", 1, 1, 0, (0, 2), federation)
    _, down = algorithm.broadcast(server, [], context)
    assert [m.dst for m in down] == ["client/0", "client/2"]
    assert all(sum(t.numel() for t in m.tensors.values()) * 32 == size * 32 for m in down)
    x, y = torch.randn(4, 1, 1, 2), torch.tensor([0, 1, 0, 1])
    state = State(
        model=build_model("logreg", (1, 1, 2), 2), data=ClientData(x, y, x, y, 2, (1, 1, 2))
    )
    _, up = algorithm.train(state, down[:1], StepContext("client/0", 1, 1, 0, (0, 2), federation))
    assert sum(t.numel() for t in up[0].tensors.values()) * 32 == size * 32  # |w|·32 up


def test_params_are_bounded_and_default_to_the_paper():
    params = FedProxParams()
    assert params.mu == 0.01 and params.straggler_fraction == 0.0
    with pytest.raises(ValidationError):
        FedProxParams(mu=-0.1)
    with pytest.raises(ValidationError):
        FedProxParams(straggler_fraction=1.5)
    assert FedProx.keeps == () and FedProx.shapes == ("star",)
