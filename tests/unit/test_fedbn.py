"""FedBN and `local_layers` (docs/ALGORITHMS.md, FedBN; fedavg.py): FedBN's steps run directly
on `cnn_bn` with contexts built here. No batch-norm tensor is in any message, either way;
every client's batch-norm statistics are its own; what stays is named by `local_names`; and
the refusals. No Ray."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raymtl.algorithms import get_algorithm
from raymtl.algorithms.base import EVERY_CLIENT, SERVER, FederationInfo, StepContext
from raymtl.algorithms.ditto import DittoParams
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.fedbn import FedBN, FedBNParams
from raymtl.algorithms.fedprox import FedProxParams
from raymtl.algorithms.local_layers import WholeModelParams, local_names
from raymtl.algorithms.per_fedavg import PerFedAvgParams
from raymtl.algorithms.pfedme import PFedMeParams
from raymtl.algorithms.training import load_received, model_tensors
from raymtl.data.client_data import ClientData
from raymtl.models import build_model

SHAPE, CLASSES = (1, 8, 8), 3
BN = {
    f"backbone.features.{layer}.{name}"
    for layer in (1, 5)  # conv, BN, ReLU, pool twice
    for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
}


def factory(model: str = "cnn_bn"):
    def build(participant: str, num_classes: int) -> nn.Module:
        torch.manual_seed(0)  # one init for every participant, as the runtime's
        return build_model(model, SHAPE, num_classes)

    return build


def client_data(k: int, samples: int = 12) -> ClientData:
    """Client k's images, shifted by k: feature shift, the setting FedBN is for."""
    generator = torch.Generator().manual_seed(k)
    x = torch.randn(samples, *SHAPE, generator=generator) * (1 + k) + 2.0 * k
    y = torch.randint(0, CLASSES, (samples,), generator=generator)
    return ClientData(x, y, x, y, CLASSES, SHAPE)


def context(me: str, clients: int, round_index: int = 1) -> StepContext:
    federation = FederationInfo(clients, (12,) * clients, (CLASSES,) * clients, SHAPE)
    return StepContext(me, round_index, 5, 0, tuple(range(clients)), federation)


def run_rounds(algorithm, clients: int = 3, rounds: int = 2):
    """Rounds of broadcast → train → aggregate; each client's State persists, as a host
    keeps it when `keeps` holds "model". Returns the server, the clients and every message."""
    federation = context(SERVER, clients).federation
    server = algorithm.init_state(SERVER, None, federation)
    states = [
        algorithm.init_state(f"client/{k}", client_data(k), federation) for k in range(clients)
    ]
    messages = []
    for round_index in range(1, rounds + 1):
        _, down = algorithm.broadcast(server, [], context(SERVER, clients, round_index))
        up = []
        for k, state in enumerate(states):
            me = f"client/{k}"
            inbox = [m for m in down if m.dst == me]
            _, outbox = algorithm.train(state, inbox, context(me, clients, round_index))
            up += outbox
        _, evaluation = algorithm.aggregate(server, up, context(SERVER, clients, round_index))
        messages += down + up + evaluation
    return server, states, messages


def test_no_message_carries_a_batch_norm_tensor_and_clients_keep_their_own():
    algorithm = FedBN(FedBNParams(epochs=1, batch_size=4, lr=0.05), factory())
    assert algorithm.keeps == ("model",)
    server, states, messages = run_rounds(algorithm)
    kinds = {m.kind for m in messages}
    assert kinds == {"global_model", "model"}
    assert any(m.evaluation_only for m in messages)  # the evaluation copies checked too
    for message in messages:
        assert not set(message.tensors) & BN, (message.kind, message.src, message.dst)
        assert message.tensors  # the shared layers travel
    server_stats = server.model.state_dict()
    means = []
    for state in states:
        own = state.model.state_dict()
        for name in ("backbone.features.1.running_mean", "backbone.features.5.running_var"):
            assert not torch.allclose(own[name], server_stats[name]), name
        assert int(own["backbone.features.1.num_batches_tracked"]) == 2 * 3  # 2 rounds × 3
        means.append(own["backbone.features.1.running_mean"])
    assert not torch.allclose(means[0], means[1])  # each client's statistics are its own
    # Evaluated with the new shared layers over its own batch norm: the last round's
    # evaluation copy loaded into the client's model leaves its BN tensors as they were.
    (evaluation, *_) = [m for m in messages if m.evaluation_only][-1:]
    assert evaluation.dst == EVERY_CLIENT  # one copy for every client
    for state in states:
        before = {name: t.clone() for name, t in state.model.state_dict().items()}
        load_received(state.model, [evaluation])
        after = state.model.state_dict()
        for name, value in model_tensors(server.model).items():
            expected = before[name] if name in BN else value
            assert torch.equal(after[name], expected), name


def test_the_shared_layers_are_the_sample_weighted_mean():
    algorithm = FedBN(FedBNParams(epochs=1, batch_size=4, lr=0.05), factory())
    server, states, messages = run_rounds(algorithm, rounds=1)
    sent = [m.tensors for m in messages if m.kind == "model"]
    for name, value in model_tensors(server.model).items():
        if name in BN:
            continue
        torch.testing.assert_close(value, sum(t[name] for t in sent) / 3)


def test_local_names():
    model = build_model("cnn_bn", SHAPE, CLASSES)
    assert local_names(model, "batchnorm") == BN
    assert local_names(model, None) == set()
    assert local_names(build_model("cnn_mnist", SHAPE, CLASSES), "batchnorm") == set()
    toy = nn.ModuleDict({"fc": nn.Linear(2, 2), "fc2": nn.Linear(2, 2)})
    assert local_names(toy, ("fc",)) == {"fc.weight", "fc.bias"}  # whole components only
    assert local_names(toy, ("fc.",)) == {"fc.weight", "fc.bias"}
    assert local_names(toy, ("fc2.bias",)) == {"fc2.bias"}


def test_fedavg_with_local_prefixes_keeps_the_head():
    params = WholeModelParams(local_layers="head", epochs=1, batch_size=4)
    algorithm = FedAvg(params, factory("cnn_mnist"))
    assert params.local_layers == ("head",)  # one prefix, as a YAML string gives it
    assert algorithm.keeps == ("model",) and FedAvg(WholeModelParams(), None).keeps == ()
    _, states, messages = run_rounds(algorithm, clients=2, rounds=1)
    for message in messages:
        assert not any(name.startswith("head.") for name in message.tensors)
    heads = [state.model.state_dict()["head.fc.weight"] for state in states]
    assert not torch.allclose(heads[0], heads[1])


def test_subclasses_that_ship_whole_models_take_local_layers():
    for name, params in [
        ("fedprox", FedProxParams(local_layers="batchnorm")),
        ("ditto", DittoParams(local_layers="batchnorm")),
        ("pfedme", PFedMeParams(local_layers="batchnorm")),
    ]:
        algorithm = get_algorithm(name)(params, None)
        assert "model" in algorithm.keeps, name
        assert set(type(algorithm).keeps) <= set(algorithm.keeps), name
    # Per-FedAvg and FedRep have their own settings: local_layers is not one of them.
    with pytest.raises(ValidationError, match="local_layers"):
        PerFedAvgParams(local_layers="batchnorm")


def test_refusals():
    with pytest.raises(ValidationError, match="local_layers: FedBN keeps layers on the clients"):
        FedBNParams(local_layers=None)
    with pytest.raises(ValidationError, match="local_layers: name a non-empty prefix"):
        WholeModelParams(local_layers=())
    assert FedBNParams(local_layers=["backbone.fc"]).local_layers == ("backbone.fc",)
    federation = context(SERVER, 1).federation
    without = FedBN(FedBNParams(), factory("mlp"))
    with pytest.raises(ValueError, match="model of server .* has no batch-norm layer"):
        without.init_state(SERVER, None, federation)
    typo = FedAvg(WholeModelParams(local_layers=("backbone.fcc",)), factory("cnn_mnist"))
    with pytest.raises(ValueError, match=r"has no tensor named backbone\.fcc\.\*"):
        typo.init_state(SERVER, None, federation)
    everything = FedAvg(WholeModelParams(local_layers=("backbone", "head")), factory())
    with pytest.raises(ValueError, match="cover every tensor .*: nothing would travel"):
        everything.init_state(SERVER, None, federation)
