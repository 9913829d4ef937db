"""FedAvg, D-PSGD and hierarchical FedAvg maths against hand-computed values (no Ray)."""

from __future__ import annotations

import math

import pytest
import torch

from raymtl.algorithms import get_algorithm
from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.algorithms.training import is_finite, weighted_average
from raymtl.models import build_model


def logreg(num_classes: int = 2):
    """Multinomial logistic regression on 2 features: weight (2, 2) + bias (2)."""
    return build_model("logreg", (1, 1, 2), num_classes)


def filled(model, value: float) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(t, value) for name, t in model.state_dict().items()}


def context(me: str, federation: FederationInfo, round_index: int = 1) -> StepContext:
    return StepContext(me, round_index, 10, 0, tuple(range(federation.num_clients)), federation)


def make(name: str, **params):
    cls = get_algorithm(name)
    return cls(cls.Params(**params), lambda num_classes: logreg(num_classes))


def test_weighted_average_is_sample_weighted():
    a, b = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([5.0, 6.0])}
    result = weighted_average([(a, 1), (b, 3)])
    assert torch.allclose(result["w"], torch.tensor([4.0, 5.0]))  # (1·1 + 3·5)/4, (1·2 + 3·6)/4


def test_non_finite_updates_are_rejected():
    good, bad = {"w": torch.tensor([2.0])}, {"w": torch.tensor([math.nan])}
    assert not is_finite(bad)
    assert torch.equal(weighted_average([(good, 1), (bad, 9)])["w"], torch.tensor([2.0]))
    assert weighted_average([(bad, 1)]) is None


def test_fedavg_server_average_and_broadcast():
    fedavg = make("fedavg")
    federation = FederationInfo(3, samples=(10, 30, 60), num_classes=(2, 2, 2), input_shape=(1, 1, 2))
    server = fedavg.init_state("server", None, federation)
    inbox = [  # client 2 did not take part this round
        Message("client/1", "server", "model", filled(server.model, 3.0)),
        Message("client/0", "server", "model", filled(server.model, 1.0)),
    ]
    server, outbox = fedavg.aggregate(server, inbox, context("server", federation))
    expected = (10 * 1.0 + 30 * 3.0) / 40  # = 2.5: only the senders' samples count
    for value in server.model.state_dict().values():
        assert torch.allclose(value, torch.full_like(value, expected))
    assert sorted(m.dst for m in outbox) == ["client/0", "client/1", "client/2"]
    assert all(m.kind == "global_model" for m in outbox)


def test_fedavg_upload_is_the_whole_model():
    fedavg = make("fedavg", epochs=1, batch_size=4)
    federation = FederationInfo(1, samples=(8,), num_classes=(2,), input_shape=(1, 1, 2))
    data = type("Data", (), {})()
    data.train_x, data.train_y, data.num_classes = torch.randn(8, 1, 1, 2), torch.zeros(8).long(), 2
    state = fedavg.init_state("client/0", data, federation)
    _, outbox = fedavg.train(state, [], context("client/0", federation))
    (message,) = outbox
    assert message.dst == "server"
    assert sum(t.numel() for t in message.tensors.values()) == 2 * 2 + 2


def test_dpsgd_metropolis_combination_on_a_path():
    # Path 0 - 1 - 2: W = [[2/3, 1/3, 0], [1/3, 1/3, 1/3], [0, 1/3, 2/3]].
    dpsgd = make("dpsgd")
    mixing = {0: {0: 2 / 3, 1: 1 / 3}, 1: {0: 1 / 3, 1: 1 / 3, 2: 1 / 3}, 2: {1: 1 / 3, 2: 2 / 3}}
    federation = FederationInfo(3, (1, 1, 1), (2, 2, 2), (1, 1, 2), mixing=mixing)
    state = State(model=logreg())
    state.model.load_state_dict(filled(state.model, 3.0))
    inbox = [
        Message("client/2", "client/1", "model", filled(state.model, 6.0)),
        Message("client/0", "client/1", "model", filled(state.model, 0.0)),
    ]
    state, outbox = dpsgd.combine(state, inbox, context("client/1", federation))
    assert outbox == []
    for value in state.model.state_dict().values():  # (0 + 3 + 6) / 3
        assert torch.allclose(value, torch.full_like(value, 3.0))


def test_dpsgd_sends_to_each_neighbour_only():
    dpsgd = make("dpsgd", batch_size=4)
    mixing = {0: {0: 0.5, 1: 0.5}, 1: {0: 0.5, 1: 0.5}, 2: {2: 1.0}}
    federation = FederationInfo(3, (4, 4, 4), (2, 2, 2), (1, 1, 2), mixing=mixing)
    data = type("Data", (), {})()
    data.train_x, data.train_y, data.num_classes = torch.randn(4, 1, 1, 2), torch.zeros(4).long(), 2
    state = dpsgd.init_state("client/0", data, federation)
    _, outbox = dpsgd.train(state, [], context("client/0", federation))
    assert [m.dst for m in outbox] == ["client/1"]


def test_hfedavg_gps_averages_common_layers_weighted_by_lps_samples():
    hfedavg = make("hfedavg", common_prefixes=("head.weight",))
    # Clients 0, 1 on LPS 0 (10 + 10 samples), client 2 on LPS 1 (60 samples).
    federation = FederationInfo(
        3, (10, 10, 60), (2, 2, 2), (1, 1, 2), lps_of_client=(0, 0, 1), num_lps=2
    )
    inbox = [
        Message("lps/0", "server", "common", {"head.weight": torch.full((2, 2), 1.0)}),
        Message("lps/1", "server", "common", {"head.weight": torch.full((2, 2), 5.0)}),
    ]
    _, outbox = hfedavg.aggregate_common(State(), inbox, context("server", federation))
    assert [m.dst for m in outbox] == ["lps/0", "lps/1"]
    expected = (20 * 1.0 + 60 * 5.0) / 80  # = 4.0
    for message in outbox:
        assert torch.allclose(message.tensors["head.weight"], torch.full((2, 2), expected))


def test_hfedavg_lps_sends_common_layers_only_on_global_rounds():
    hfedavg = make("hfedavg", global_every=2, common_prefixes=("head.weight",))
    federation = FederationInfo(2, (1, 3), (2, 2), (1, 1, 2), lps_of_client=(0, 0), num_lps=1)
    lps = hfedavg.init_state("lps/0", None, federation)
    user_model = hfedavg.model_factory(2)
    inbox = [
        Message("client/0", "lps/0", "model", filled(user_model, 0.0)),
        Message("client/1", "lps/0", "model", filled(user_model, 4.0)),
    ]
    lps, outbox = hfedavg.aggregate(lps, inbox, context("lps/0", federation, round_index=1))
    assert outbox == []
    (head_bias,) = lps.extras["model"]["head.bias"].values()  # one task: one average
    assert torch.allclose(head_bias, torch.full((2,), 3.0))
    _, outbox = hfedavg.aggregate(lps, inbox, context("lps/0", federation, round_index=2))
    assert [(m.dst, list(m.tensors)) for m in outbox] == [("server", ["head.weight"])]
    assert [p.step for p in hfedavg.phases(1, 10)] == ["train", "aggregate", "broadcast", "receive"]
    assert "aggregate_common" in [p.step for p in hfedavg.phases(2, 10)]


@pytest.mark.parametrize("name", ["fedavg", "local", "dpsgd", "hfedavg"])
def test_every_algorithm_is_registered_with_typed_params(name):
    cls = get_algorithm(name)
    assert cls.name == name and cls.summary
    with pytest.raises(ValueError):
        cls.Params(no_such_parameter=1)
