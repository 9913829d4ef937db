"""The built-in SCAFFOLD (raymtl/algorithms/scaffold.py; docs/ALGORITHMS.md, SCAFFOLD) against
option II's formulas on a one-weight model: the paper's plain means (not weighted by
samples), η_g, c ← c + (1/N)·Σ Δc_k, round 2's corrected steps, and what it refuses or
declares. No Ray: the steps are called directly."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raymtl.algorithms import get_algorithm
from raymtl.algorithms.base import SERVER, FederationInfo, Message, StepContext
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.local_layers import WholeModelParams
from raymtl.algorithms.scaffold import Scaffold, ScaffoldParams, server_control
from raymtl.data.client_data import ClientData
from raymtl.tasks.spec import OptimizerSpec, TaskSpec
from raymtl.toolbox.settings import AggregationSettings, Toolbox

MSE = TaskSpec(name="y", targets="y", loss="mse", outputs=1, metrics=("mse",))
N = 4  # clients in the federation; clients 0 and 1 are sampled


def one_weight(participant: str, num_classes: int) -> nn.Module:
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    return model


def regression(samples: int) -> ClientData:
    """x = 1, y = 0 for every sample: f(w) = w², g(w) = 2w whatever the batch."""
    x, y = torch.ones(samples, 1), torch.zeros(samples, 1)
    return ClientData(x, y, x, y, 1, (1, 1, 1), task=MSE)


SAMPLES = (2, 3, 5, 5)  # with batches of one: K_0 = 2, K_1 = 3 steps


def context(me: str, round_index: int, toolbox: Toolbox | None = None) -> StepContext:
    federation = FederationInfo(N, SAMPLES, (1,) * N, (1, 1, 1))
    extra = {"toolbox": toolbox} if toolbox is not None else {}
    return StepContext(me, round_index, 5, 0, (0, 1), federation, **extra)


class Federation:
    """The server and the two sampled clients, their states kept between rounds."""

    def __init__(self, algorithm, toolbox: Toolbox | None = None):
        self.algorithm, self.toolbox = algorithm, toolbox
        federation = context(SERVER, 1).federation
        self.server = algorithm.init_state(SERVER, None, federation)
        self.clients = [
            algorithm.init_state(f"client/{k}", regression(SAMPLES[k]), federation) for k in (0, 1)
        ]
        self.up: list[Message] = []

    def round(self, round_index: int) -> float:
        _, down = self.algorithm.broadcast(self.server, [], context(SERVER, round_index))
        self.up = []
        for k, state in enumerate(self.clients):
            me = f"client/{k}"
            inbox = [m for m in down if m.dst == me]
            _, outbox = self.algorithm.train(state, inbox, context(me, round_index, self.toolbox))
            self.up += outbox
        self.algorithm.aggregate(self.server, self.up, context(SERVER, round_index, self.toolbox))
        return float(self.server.model.weight.detach())

    def control(self) -> float:
        return float(self.server.extras["control"]["weight"])

    def client_control(self, k: int) -> float:
        return float(self.clients[k].extras["control"]["weight"])


def test_round_one_by_hand_with_plain_means():
    """x = 1, c = c_k = 0, η_l = 0.1, η_g = 1.
    client 0, K = 2: y = 1 → 0.8 → 0.64;  c_0⁺ = (1 − 0.64)/(2·0.1) = 1.8
    client 1, K = 3: y = 1 → 0.8 → 0.64 → 0.512;  c_1⁺ = (1 − 0.512)/(3·0.1) = 1.62667
    x ← 1 + mean(y_k − 1) = (0.64 + 0.512)/2 = 0.576 (sample-weighted: 0.5632)
    c ← 0 + (1/4)·(1.8 + 1.62667) = 0.85667"""
    federation = Federation(Scaffold(ScaffoldParams(epochs=1, batch_size=1, lr=0.1), one_weight))
    x = federation.round(1)
    assert x == pytest.approx(0.576, abs=1e-7)
    assert federation.client_control(0) == pytest.approx(1.8, abs=1e-6)
    assert federation.client_control(1) == pytest.approx(0.488 / 0.3, abs=1e-6)
    assert federation.control() == pytest.approx((1.8 + 0.488 / 0.3) / 4, abs=1e-6)
    kinds = [(m.src, m.kind) for m in federation.up]
    assert kinds == [
        ("client/0", "model"),
        ("client/0", "control"),
        ("client/1", "model"),
        ("client/1", "control"),
    ]


def test_server_lr_scales_the_step():
    """η_g = 0.5: x ← 1 + 0.5·(0.576 − 1) = 0.788; c is the same as with η_g = 1."""
    params = ScaffoldParams(epochs=1, batch_size=1, lr=0.1, server_lr=0.5)
    federation = Federation(Scaffold(params, one_weight))
    assert federation.round(1) == pytest.approx(0.788, abs=1e-7)
    assert federation.control() == pytest.approx((1.8 + 0.488 / 0.3) / 4, abs=1e-6)


def test_round_two_follows_option_two():
    """From round 1's x, c, c_k: K steps of y ← y − η_l·(2y − c_k + c), then
    c_k⁺ = c_k − c + (x − y_k)/(K·η_l); x ← x + mean(Δy_k); c ← c + (1/N)·Σ Δc_k."""
    lr = 0.1
    federation = Federation(Scaffold(ScaffoldParams(epochs=1, batch_size=1, lr=lr), one_weight))
    x = federation.round(1)
    c, c_k = federation.control(), [federation.client_control(k) for k in (0, 1)]
    ys, new_c_k = [], []
    for k, steps in enumerate((2, 3)):
        y = x
        for _ in range(steps):
            y = y - lr * (2 * y - c_k[k] + c)
        ys.append(y)
        new_c_k.append(c_k[k] - c + (x - y) / (steps * lr))
    expected_x = x + sum(y - x for y in ys) / 2
    expected_c = c + sum(new - old for new, old in zip(new_c_k, c_k, strict=True)) / N
    assert federation.round(2) == pytest.approx(expected_x, abs=1e-6)
    assert federation.control() == pytest.approx(expected_c, abs=1e-6)
    for k in (0, 1):
        assert federation.client_control(k) == pytest.approx(new_c_k[k], abs=1e-5)


def test_round_one_is_fedavg_with_uniform_weights():
    """c = c_k = 0 and η_g = 1: FedAvg's round under `weights: uniform` (the same numbers),
    not its default sample-weighted one."""
    settings = {"epochs": 1, "batch_size": 1, "lr": 0.1}
    scaffold = Federation(Scaffold(ScaffoldParams(**settings), one_weight)).round(1)
    uniform = Toolbox(aggregation=AggregationSettings(weights="uniform"))
    fedavg = Federation(FedAvg(WholeModelParams(**settings), one_weight), uniform).round(1)
    by_samples = Federation(FedAvg(WholeModelParams(**settings), one_weight)).round(1)
    assert scaffold == pytest.approx(fedavg, abs=1e-7)
    assert by_samples == pytest.approx((2 * 0.64 + 3 * 0.512) / 5, abs=1e-7)
    assert abs(scaffold - by_samples) > 1e-3


def test_a_non_finite_client_is_left_out_of_both_sums():
    algorithm = Scaffold(ScaffoldParams(), one_weight)
    federation = context(SERVER, 1).federation
    server = algorithm.init_state(SERVER, None, federation)
    w = {"weight": torch.tensor([[0.5]])}
    inbox = [
        Message("client/0", SERVER, "model", w),
        Message("client/0", SERVER, "control", {"weight": torch.tensor([[0.4]])}),
        Message("client/1", SERVER, "model", {"weight": torch.tensor([[9.0]])}),
        Message("client/1", SERVER, "control", {"weight": torch.tensor([[float("nan")]])}),
    ]
    algorithm.aggregate(server, inbox, context(SERVER, 1))
    assert float(server.model.weight.detach()) == 0.5
    assert float(server.extras["control"]["weight"]) == pytest.approx(0.4 / N)


def test_server_control_sums_plainly():
    c = {"w": torch.tensor([0.1, 0.2])}
    deltas = [{"w": torch.tensor([0.4, -0.8])}, {"w": torch.tensor([0.2, 0.4])}]
    # c + (1/8)·([0.4, -0.8] + [0.2, 0.4]) = [0.1 + 0.075, 0.2 − 0.05]
    torch.testing.assert_close(server_control(c, deltas, 8)["w"], torch.tensor([0.175, 0.15]))
    assert server_control(c, [], 8) is c


def test_declared_contract():
    cls = get_algorithm("scaffold")
    assert cls is Scaffold and cls.__module__ == "raymtl.algorithms.scaffold"
    assert cls.toolbox == ("aggregation", "server_optimizer", "uplink")  # no central DP
    assert cls.uplink_kinds == ("model",) and cls.keeps == ("extras",)


@pytest.mark.parametrize(
    ("settings", "field"), [({"momentum": 0.9}, "momentum"), ({"clip_grad": 1.0}, "clip_grad")]
)
def test_params_refuse_what_is_not_plain_sgd(settings, field):
    with pytest.raises(ValidationError, match=f"{field}: SCAFFOLD's correction needs plain SGD"):
        ScaffoldParams(**settings)


def test_a_task_optimiser_other_than_plain_sgd_is_refused():
    algorithm = Scaffold(ScaffoldParams(), None)
    adam = TaskSpec(name="faces", optimizer=OptimizerSpec("adam", lr=1e-3))
    federation = FederationInfo(1, (4,), (2,), (1, 1, 1), tasks=(0,), task_specs=(adam,))
    with pytest.raises(ValueError, match="task 'faces' trains with adam; SCAFFOLD's correction"):
        algorithm.check_resources(federation, memory_budget=1e9)
