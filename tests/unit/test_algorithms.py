"""The algorithm contract (base class defaults, `check_contract`, the registry) and FedAvg,
D-PSGD and hierarchical FedAvg maths against hand-computed values (no Ray)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import BaseModel

from raymtl.algorithms import all_algorithms, get_algorithm
from raymtl.algorithms.aggregate import is_finite, weighted_average
from raymtl.algorithms.base import (
    EVERY_CLIENT,
    Algorithm,
    FederationInfo,
    Message,
    Params,
    Phase,
    State,
    StepContext,
)
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.registry import ALGORITHMS, check_contract, register_algorithm
from raymtl.algorithms.training import load_received
from raymtl.data.client_data import ClientData
from raymtl.models import build_model


def logreg(num_classes: int = 2):
    """Multinomial logistic regression on 2 features: weight (2, 2) + bias (2)."""
    return build_model("logreg", (1, 1, 2), num_classes)


def filled(model, value: float) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(t, value) for name, t in model.state_dict().items()}


def client_data(x: torch.Tensor, y: torch.Tensor, num_classes: int = 2) -> ClientData:
    """A client's data with its test split equal to its training split."""
    return ClientData(x, y, x, y, num_classes, (1, 1, 2))


def context(me: str, federation: FederationInfo, round_index: int = 1) -> StepContext:
    return StepContext(me, round_index, 10, 0, tuple(range(federation.num_clients)), federation)


def make(name: str, **params):
    cls = get_algorithm(name)
    return cls(cls.Params(**params), lambda participant, num_classes: logreg(num_classes))


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
    federation = FederationInfo(
        3, samples=(10, 30, 60), num_classes=(2, 2, 2), input_shape=(1, 1, 2)
    )
    server = fedavg.init_state("server", None, federation)
    inbox = [  # client 2 did not take part this round
        Message("client/1", "server", "model", filled(server.model, 3.0)),
        Message("client/0", "server", "model", filled(server.model, 1.0)),
    ]
    server, outbox = fedavg.aggregate(server, inbox, context("server", federation))
    expected = (10 * 1.0 + 30 * 3.0) / 40  # = 2.5: only the senders' samples count
    for value in server.model.state_dict().values():
        assert torch.allclose(value, torch.full_like(value, expected))
    (copy,) = outbox  # one evaluation copy to every client, whatever N
    assert copy.dst == EVERY_CLIENT and copy.evaluation_only and copy.kind == "global_model"


def test_fedavg_upload_is_the_whole_model():
    fedavg = make("fedavg", epochs=1, batch_size=4)
    federation = FederationInfo(1, samples=(8,), num_classes=(2,), input_shape=(1, 1, 2))
    data = client_data(torch.randn(8, 1, 1, 2), torch.zeros(8).long())
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
    data = client_data(torch.randn(4, 1, 1, 2), torch.zeros(4).long())
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
    user_model = hfedavg.model_factory("client/0", 2)
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


@pytest.mark.parametrize("name", sorted(all_algorithms()))
def test_every_algorithm_keeps_the_contract_with_typed_params(name):
    cls = get_algorithm(name)
    assert cls.name == name and cls.summary
    check_contract(cls)  # what `register_algorithm` checked when the module was imported
    with pytest.raises(ValueError):
        cls.Params(no_such_parameter=1)


# -- the contract -------------------------------------------------------------------------


class Minimal(Algorithm):
    """A valid algorithm: one client step."""

    name = "minimal_for_tests"

    def phases(self, round_index, rounds):
        return [Phase("client", "train", "all", trains=True)]

    def train(self, state, inbox, ctx):
        return state, []


def broken(**attributes) -> type:
    """A subclass of Minimal named "broken_for_tests", with `attributes` replaced (functions
    become methods)."""
    namespace = {"__module__": "tests.broken", "name": "broken_for_tests", **attributes}
    return type("Broken", (Minimal,), namespace)


class OtherParams(BaseModel):
    lr: float = 0.1


@pytest.mark.parametrize(
    ("attributes", "says"),
    [
        ({"name": ""}, "declares no `name`"),
        ({"name": None}, "declares no `name`"),
        ({"Params": OtherParams}, "not a subclass of raymtl.algorithms.base.Params"),
        ({"shapes": ("star", "ring")}, "shapes = ('star', 'ring'): a tuple of star, peer"),
        ({"shapes": "star"}, "shapes = 'star': a tuple of"),
        ({"shapes": ()}, "shapes is empty"),
        ({"keeps": ("model", "optimizer")}, "keeps = ('model', 'optimizer'): a tuple of model"),
        ({"task_support": "any"}, "task_support = 'any' is not one of same, labels, different"),
        ({"model_support": "mixed"}, "model_support = 'mixed' is not one of same, different"),
        ({"phases": Algorithm.phases}, "does not define phases(round_index, rounds)"),
        (
            {"phases": lambda self, r, n: [Phase("client", "train"), Phase("server", "mix")]},
            "phases(1, 2) names step 'mix' (server), which it does not define",
        ),
        (
            {"phases": lambda self, r, n: [Phase("client", "train" if r == 1 else "tune")]},
            "phases(2, 2) names step 'tune' (client), which it does not define",
        ),
        ({"phases": lambda self, r, n: [Phase("worker", "train")]}, "role 'worker', not one of"),
        ({"phases": lambda self, r, n: [Phase("client", "train", "some")]}, "who 'some'"),
        ({"phases": lambda self, r, n: 1 / 0}, "phases(1, 2) raised ZeroDivisionError"),
    ],
)
def test_check_contract_refuses_in_one_line_naming_the_class(attributes, says):
    cls = broken(**attributes)
    with pytest.raises(ValueError) as error:
        check_contract(cls)
    message = str(error.value)
    assert message.startswith("algorithm class tests.broken.Broken: ") and "\n" not in message
    assert says in message
    with pytest.raises(ValueError, match="tests.broken.Broken"):
        register_algorithm(cls)  # it checks first: nothing is registered
    assert all(c is not cls for c in all_algorithms().values())


def test_a_subclass_must_name_itself():
    class Variant(FedAvg):  # forgot `name`: it must not pass for FedAvg
        pass

    with pytest.raises(ValueError, match="declares no `name` .* inherit 'fedavg'"):
        register_algorithm(Variant)
    assert get_algorithm("fedavg") is FedAvg


def test_check_contract_refuses_what_is_not_an_algorithm():
    with pytest.raises(ValueError, match="is not a subclass of raymtl.algorithms.base.Algorithm"):
        check_contract(dict)


def test_params_without_defaults_leave_the_steps_to_the_config():
    class Required(Params):
        lam: float  # no default: phases() cannot be asked before a config gives it

    check_contract(broken(Params=Required))


def test_register_adds_replaces_a_reimport_and_refuses_a_second_class():
    cls = register_algorithm(broken(name="contract_test"))
    try:
        assert get_algorithm("contract_test") is cls
        again = register_algorithm(broken(name="contract_test"))  # the same module run again
        assert get_algorithm("contract_test") is again
        other = type("Other", (Minimal,), {"__module__": "tests.other", "name": "contract_test"})
        with pytest.raises(ValueError, match="'contract_test' is registered twice"):
            register_algorithm(other)
        assert get_algorithm("contract_test") is again
    finally:
        ALGORITHMS.pop("contract_test", None)


def test_the_base_hooks_have_their_documented_defaults():
    algorithm = Minimal(Minimal.Params(), lambda participant, classes: logreg(classes))
    federation = FederationInfo(1, (4,), (3,), (1, 1, 2))
    data = client_data(torch.zeros(0, 1, 1, 2), torch.zeros(0).long(), num_classes=3)
    client = algorithm.init_state("client/0", data, federation)
    assert client.data is data and client.model.head.out_features == 3
    assert algorithm.init_state("server", None, federation).model is None
    assert algorithm.eval_model(client) is client.model
    assert algorithm.state_size(client.model) == 2 * 3 + 3  # logreg: weight (3, 2) + bias
    assert algorithm.persistent_bytes([9], federation) is None
    assert algorithm.check_resources(federation, 1.0) is None
    assert algorithm.rehost("client/0", client) is client
    assert algorithm.batched_step(Phase("client", "train", trains=True)) is None
    assert not Minimal.evaluates_its_own_model()
    assert get_algorithm("ditto").evaluates_its_own_model()


def test_a_subclass_that_changes_train_never_trains_as_its_parent_in_batches():
    class Doubling(FedAvg):  # not registered: a FedAvg variant with its own client step
        name = "doubling_for_tests"

        def train(self, state, inbox, ctx):
            state.extras["trained_by"] = "doubling"
            return state, []

    class Momentum(FedAvg):  # changes the server only: FedAvg's batched step still holds
        name = "momentum_for_tests"

    (train,) = [p for p in FedAvg(FedAvg.Params(), None).phases(1, 1) if p.trains]
    assert train.batched == "train_batch"
    assert FedAvg(FedAvg.Params(), None).batched_step(train) == "train_batch"
    assert Momentum(Momentum.Params(), None).batched_step(train) == "train_batch"
    assert Doubling(Doubling.Params(), None).batched_step(train) is None  # one by one
    pfedme = get_algorithm("pfedme")
    assert pfedme(pfedme.Params(), None).batched_step(train) is None


def test_a_plugins_own_params_carry_what_the_runtime_reads():
    """Params derived from the base `Params` (not local SGD's) still have sample_fraction,
    which every round reads; a Params class of another kind is refused at registration."""

    class OwnParams(Params):
        rho: float = 0.5

    class Plain(Minimal):
        name = "plain_params_for_tests"
        Params = OwnParams

    assert Plain.Params().sample_fraction == 1.0
    check_contract(Plain)
    not_params = type("NotParams", (), {})
    refused = type("Refused", (Minimal,), {"name": "refused_for_tests", "Params": not_params})
    with pytest.raises(ValueError, match="Params is .* not a subclass of raymtl"):
        check_contract(refused)


def test_load_received_loads_every_message_in_inbox_order():
    model = logreg()
    load_received(model, [])  # nothing received: nothing changes
    inbox = [
        Message("server", "client/0", "global_model", filled(model, 1.0)),
        Message("lps/0", "client/0", "lps_model", {"head.bias": torch.tensor([7.0, 8.0])}),
    ]
    load_received(model, inbox)
    assert torch.equal(model.head.bias.detach(), torch.tensor([7.0, 8.0]))
    assert torch.equal(model.head.weight.detach(), torch.ones(2, 2))
