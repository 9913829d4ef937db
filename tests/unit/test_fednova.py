"""FedNova (docs/ALGORITHMS.md, FedNova) on numbers worked out by hand: ‖a_k‖₁ for plain SGD,
momentum and a proximal term; the server's normalised step with unequal τ_k; FedAvg exactly
when every τ_k is equal; `local_sgd`'s step count and the heterogeneous epochs (`epochs_max`)
FedAvg and FedNova share. No Ray: the steps are called directly."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raymtl.algorithms import get_algorithm
from raymtl.algorithms.base import SERVER, FederationInfo, Message, Phase, StepContext
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.fednova import (
    NORM_A,
    FedNova,
    FedNovaParams,
    normalised_models,
    normalising_norm,
)
from raymtl.algorithms.local_layers import WholeModelParams, round_epochs, round_params
from raymtl.algorithms.training import LocalRun, derive_seed, local_sgd
from raymtl.data.client_data import ClientData
from raymtl.tasks.spec import OptimizerSpec, TaskSpec
from raymtl.toolbox.settings import AggregationSettings, Toolbox

SHAPE = (1, 1, 3)


def factory(participant: str, num_classes: int) -> nn.Module:
    """One seeded init for every participant, as the runtime's factory gives."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3, num_classes))


def client_data(samples: int, seed: int) -> ClientData:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, *SHAPE, generator=generator)
    y = torch.randint(0, 2, (samples,), generator=generator)
    return ClientData(x, y, x, y, 2, SHAPE)


def context(me: str, samples: tuple[int, ...], toolbox: Toolbox | None = None) -> StepContext:
    federation = FederationInfo(len(samples), samples, (2,) * len(samples), SHAPE)
    extra = {"toolbox": toolbox} if toolbox is not None else {}
    return StepContext(me, 1, 5, 0, tuple(range(len(samples))), federation, **extra)


def one_round(algorithm, samples: tuple[int, ...], toolbox: Toolbox | None = None):
    """broadcast → train → aggregate on clients holding `samples` samples: (w_t, the clients'
    outboxes, the server's new model tensors, the step contexts of the clients)."""
    federation = FederationInfo(len(samples), samples, (2,) * len(samples), SHAPE)
    server = algorithm.init_state(SERVER, None, federation)
    w_t = {name: t.clone() for name, t in server.model.state_dict().items()}
    _, down = algorithm.broadcast(server, [], context(SERVER, samples, toolbox))
    outboxes, contexts = [], []
    for k, n in enumerate(samples):
        me = f"client/{k}"
        state = algorithm.init_state(me, client_data(n, seed=k), federation)
        ctx = context(me, samples, toolbox)
        _, outbox = algorithm.train(state, [m for m in down if m.dst == me], ctx)
        outboxes.append(outbox)
        contexts.append(ctx)
    inbox = [message for outbox in outboxes for message in outbox]
    _, evaluation = algorithm.aggregate(server, inbox, context(SERVER, samples, toolbox))
    assert all(m.evaluation_only for m in evaluation)
    return w_t, outboxes, dict(server.model.state_dict()), contexts


# ‖a_k‖₁ -----------------------------------------------------------------------------------


def test_norm_of_a_by_hand():
    assert normalising_norm(5, lr=0.1) == 5.0  # plain SGD: τ
    # ρ = 0.5, τ = 3: [3 − 0.5·(1 − 0.125)/0.5]/0.5 = (3 − 0.875)/0.5 = 4.25
    assert normalising_norm(3, lr=0.1, momentum=0.5) == 4.25
    # ρ = 0.5, τ = 2: [2 − 0.5·(1 − 0.25)/0.5]/0.5 = 1.25/0.5 = 2.5
    assert normalising_norm(2, lr=0.1, momentum=0.5) == 2.5
    # η·μ = 0.1, τ = 3: [1 − 0.9³]/0.1 = 0.271/0.1 = 2.71
    assert normalising_norm(3, lr=0.1, mu=1.0) == pytest.approx(2.71, abs=1e-14)
    # η·μ = 0.1, τ = 2: [1 − 0.81]/0.1 = 1.9
    assert normalising_norm(2, lr=0.1, mu=1.0) == pytest.approx(1.9, abs=1e-14)
    assert normalising_norm(0, lr=0.1, momentum=0.9) == 0.0  # no step: nothing moved
    with pytest.raises(ValueError, match="momentum and a proximal term"):
        normalising_norm(3, lr=0.1, momentum=0.5, mu=1.0)


@pytest.mark.parametrize("tau", [1, 2, 7, 40])
@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9])
def test_norm_of_a_matches_the_closed_forms(tau, rho):
    closed = (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
    assert normalising_norm(tau, lr=0.05, momentum=rho) == pytest.approx(closed, rel=1e-12)
    rate = 0.05 * rho  # η·μ with μ = ρ here
    closed = (1 - (1 - rate) ** tau) / rate
    assert normalising_norm(tau, lr=0.05, mu=rho) == pytest.approx(closed, rel=1e-12)


def test_norm_of_a_near_rho_one_does_not_cancel():
    """ρ = 0.999, τ = 1000: the exact value Σ_{i<τ} (τ − i)·ρ^i, from fractions."""
    rho, tau = Fraction(999, 1000), 1000
    exact = float(sum((tau - i) * rho**i for i in range(tau)))
    assert normalising_norm(tau, lr=0.05, momentum=0.999) == pytest.approx(exact, rel=1e-13)


def test_local_sgd_returns_its_steps():
    """n = 10, B = 4, E = 2: ⌈10/4⌉ = 3 batches an epoch, 6 steps."""
    data = client_data(10, seed=0)
    params = WholeModelParams(epochs=2, batch_size=4, lr=0.1)
    run = local_sgd(factory("client/0", 2), data.train_x, data.train_y, params, seed=1)
    assert isinstance(run, LocalRun) and run.steps == 6 and math.isfinite(run.loss)
    stopped = local_sgd(factory("client/0", 2), data.train_x, data.train_y, params, 1, max_steps=4)
    assert stopped.steps == 4


# the server's step ----------------------------------------------------------------------


def fednova_inbox(w: dict, clients: list[tuple[list[float], float]]) -> list[Message]:
    """client/k sends w_k = `clients[k][0]` (as the weight; the bias stays at w_t's) and
    ‖a_k‖₁ = `clients[k][1]`."""
    inbox = []
    for k, (weight, norm) in enumerate(clients):
        model = {"1.weight": torch.tensor([weight]), "1.bias": w["1.bias"].clone()}
        inbox.append(Message(f"client/{k}", SERVER, "model", model))
        norm_a = {NORM_A: torch.tensor([norm], dtype=torch.float64)}
        inbox.append(Message(f"client/{k}", SERVER, NORM_A, norm_a))
    return inbox


def server_step(clients, samples, toolbox: Toolbox | None = None, start=(1.0, 2.0, 0.0)):
    algorithm = FedNova(
        FedNovaParams(), lambda participant, classes: nn.Sequential(nn.Flatten(), nn.Linear(3, 1))
    )
    federation = FederationInfo(len(samples), samples, (1,) * len(samples), SHAPE)
    server = algorithm.init_state(SERVER, None, federation)
    with torch.no_grad():
        server.model[1].weight.copy_(torch.tensor([start]))
    w = {name: t.clone() for name, t in server.model.state_dict().items()}
    algorithm.aggregate(server, fednova_inbox(w, clients), context(SERVER, samples, toolbox))
    return server.model[1].weight.detach()[0]


def test_server_step_with_unequal_tau_by_hand():
    """w_t = [1, 2, 0]; w_1 = [0, 1, 0] after τ = 2 (n = 1); w_2 = [0.5, 3, 0] after τ = 4
    (n = 3), plain SGD (‖a_k‖₁ = τ_k)."""
    new = server_step([([0.0, 1.0, 0.0], 2.0), ([0.5, 3.0, 0.0], 4.0)], samples=(1, 3))
    # p = [1/4, 3/4]; τ_eff = 2/4 + 3·4/4 = 3.5
    # d_1 = ([1, 2] − [0, 1])/2 = [0.5, 0.5];  d_2 = ([1, 2] − [0.5, 3])/4 = [0.125, −0.25]
    # Σ p·d = [0.125 + 0.09375, 0.125 − 0.1875] = [0.21875, −0.0625]
    # w = [1, 2] − 3.5·[0.21875, −0.0625] = [0.234375, 2.21875]
    torch.testing.assert_close(new, torch.tensor([0.234375, 2.21875, 0.0]), rtol=0, atol=1e-7)
    # FedAvg would take [0.25·0 + 0.75·0.5, 0.25·1 + 0.75·3] = [0.375, 2.5]: the longer work
    # of client 2 would pull w further than its share.


def test_server_step_with_uniform_weights_by_hand():
    """The same clients under `aggregation.weights: uniform`: p_k = 1/2 in τ_eff and the mean."""
    uniform = Toolbox(aggregation=AggregationSettings(weights="uniform"))
    new = server_step([([0.0, 1.0, 0.0], 2.0), ([0.5, 3.0, 0.0], 4.0)], (1, 3), uniform)
    # τ_eff = (2 + 4)/2 = 3; Σ p·d = ([0.5, 0.5] + [0.125, −0.25])/2 = [0.3125, 0.125]
    # w = [1, 2] − 3·[0.3125, 0.125] = [0.0625, 1.625]
    torch.testing.assert_close(new, torch.tensor([0.0625, 1.625, 0.0]), rtol=0, atol=1e-7)


def test_a_non_finite_client_is_left_out_of_tau_eff_too():
    clean = server_step([([0.0, 1.0, 0.0], 2.0)], samples=(1,))
    with_nan = server_step(
        [([0.0, 1.0, 0.0], 2.0), ([float("nan"), 3.0, 0.0], 4.0)], samples=(1, 3)
    )
    assert torch.equal(clean, with_nan)  # one client: w_1 itself
    torch.testing.assert_close(clean, torch.tensor([0.0, 1.0, 0.0]))


def formula(w_t: dict, outboxes, samples) -> dict:
    """w_t − τ_eff·Σ p_k·d_k in float64 from the clients' messages (the spec's formula)."""
    p = [n / sum(samples) for n in samples]
    models = [outbox[0].tensors for outbox in outboxes]
    norms = [float(outbox[1].tensors[NORM_A][0]) for outbox in outboxes]
    tau_eff = sum(pk * a for pk, a in zip(p, norms, strict=True))
    result = {}
    for name, start in w_t.items():
        start = start.double()
        step = sum(
            pk * (start - model[name].double()) / a
            for pk, model, a in zip(p, models, norms, strict=True)
        )
        result[name] = start - tau_eff * step
    return result


@pytest.mark.parametrize(
    ("settings", "norms"),
    [
        ({}, [2.0, 3.0]),  # plain SGD: ‖a_k‖₁ = τ_k
        ({"momentum": 0.5}, [2.5, 4.25]),  # ρ = 0.5: by hand above
        ({"mu": 1.0}, [1.9, 2.71]),  # η·μ = 0.1: by hand above
    ],
    ids=["sgd", "momentum", "proximal"],
)
def test_a_round_with_unequal_tau_follows_the_formula(settings, norms):
    """n = 6 and 10 samples in batches of 4: τ = 2 and 3 steps."""
    params = FedNovaParams(epochs=1, batch_size=4, lr=0.1, **settings)
    samples = (6, 10)
    w_t, outboxes, new, contexts = one_round(FedNova(params, factory), samples)
    for outbox, norm, ctx in zip(outboxes, norms, contexts, strict=True):
        assert [m.kind for m in outbox] == ["model", NORM_A]
        sent = outbox[1].tensors[NORM_A]
        assert sent.dtype == torch.float64 and sent.shape == (1,)
        assert float(sent[0]) == pytest.approx(norm, abs=1e-14)
        ((table, row),) = ctx.records  # reported: τ_k, ‖a_k‖₁, E_k
        assert table == "step_metrics" and row["participant"] == ctx.me
        assert row["norm_a"] == float(sent[0]) and row["epochs"] == 1
    assert [row["tau"] for ctx in contexts for _, row in ctx.records] == [2, 3]
    expected = formula(w_t, outboxes, samples)
    for name, value in expected.items():
        torch.testing.assert_close(new[name].double(), value, rtol=0, atol=1e-6)
    assert not torch.allclose(new["1.weight"], fedavg_round(samples)["1.weight"])


def fedavg_round(samples, params=None):
    params = params or WholeModelParams(epochs=1, batch_size=4, lr=0.1)
    return one_round(FedAvg(params, factory), samples)[2]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_equal_tau_is_fedavg_bit_for_bit(momentum):
    """Equal sample counts: equal τ_k and ‖a_k‖₁, τ_eff = ‖a_k‖₁, the scale exactly 1."""
    samples = (8, 8, 8)
    settings = {"epochs": 2, "batch_size": 3, "lr": 0.1, "momentum": momentum}
    _, fednova_out, fednova, _ = one_round(FedNova(FedNovaParams(**settings), factory), samples)
    _, fedavg_out, fedavg, _ = one_round(FedAvg(WholeModelParams(**settings), factory), samples)
    for ours, theirs in zip(fednova_out, fedavg_out, strict=True):
        for name, value in theirs[0].tensors.items():
            assert torch.equal(ours[0].tensors[name], value), name
    for name, value in fedavg.items():
        assert torch.equal(fednova[name], value), name


def test_normalised_models_pass_equal_work_through_untouched():
    reference = {"w": torch.tensor([1.0, 2.0])}
    models = [{"w": torch.tensor([0.3, 1e-8])}, {"w": torch.tensor([-2.0, 7.0])}]
    normalised, tau_eff = normalised_models(
        reference, [(m, 4.25, n) for m, n in zip(models, (3, 7), strict=True)]
    )
    assert tau_eff == 4.25
    assert all(x is m for (x, _), m in zip(normalised, models, strict=True))
    # A client that ran no step (‖a_k‖₁ = 0) contributes w_t: d_k = 0.
    ((still, _),), _ = normalised_models(reference, [(models[0], 0.0, 1)])
    assert torch.equal(still["w"], reference["w"])


# heterogeneous work ----------------------------------------------------------------------


def test_epochs_are_drawn_per_client_and_round_within_the_range():
    params = WholeModelParams(epochs=1, epochs_max=4)
    draws = {
        (round_index, k): round_epochs(
            params, StepContext(f"client/{k}", round_index, 9, 3, (), None)
        )
        for round_index in range(1, 6)
        for k in range(8)
    }
    assert set(draws.values()) <= {1, 2, 3, 4} and len(set(draws.values())) > 1
    again = round_epochs(params, StepContext("client/5", 2, 9, 3, (), None))
    assert again == draws[(2, 5)]  # seeded: the same wherever the client runs
    fixed = WholeModelParams(epochs=2)
    assert round_params(fixed, StepContext("client/0", 1, 9, 3, (), None)) is fixed
    with pytest.raises(ValidationError, match="epochs_max: 1 is below epochs = 2"):
        WholeModelParams(epochs=2, epochs_max=1)


def test_fedavg_trains_the_drawn_epochs_and_not_batched():
    params = WholeModelParams(epochs=1, epochs_max=5, batch_size=4, lr=0.1)
    algorithm = FedAvg(params, factory)
    phase = Phase("client", "train", "sampled", trains=True, batched="train_batch")
    assert algorithm.batched_step(phase) is None
    assert FedAvg(WholeModelParams(), factory).batched_step(phase) == "train_batch"
    samples = (10,)
    ctx = context("client/0", samples)
    drawn = round_epochs(params, ctx)
    federation = ctx.federation
    state = algorithm.init_state("client/0", client_data(10, seed=0), federation)
    start = {name: t.clone() for name, t in state.model.state_dict().items()}
    _, outbox = algorithm.train(state, [Message(SERVER, "client/0", "global_model", start)], ctx)
    reference = factory("client/0", 2)
    data = client_data(10, seed=0)
    seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
    run = local_sgd(reference, data.train_x, data.train_y, round_params(params, ctx), seed)
    assert run.steps == drawn * 3
    for name, value in reference.state_dict().items():
        assert torch.equal(outbox[0].tensors[name], value), name


# refusals ---------------------------------------------------------------------------------


def test_momentum_with_a_proximal_term_is_refused():
    with pytest.raises(ValidationError, match="mu: FedNova's ‖a_k‖₁ is known for momentum or"):
        FedNovaParams(momentum=0.5, mu=0.1)


def test_a_task_optimiser_without_a_formula_is_refused():
    algorithm = get_algorithm("fednova")(FedNovaParams(mu=0.1), None)
    for optimizer, message in [
        (OptimizerSpec("adam", lr=1e-3), "task 't' trains with adam; FedNova's normalisation"),
        (OptimizerSpec("sgd", momentum=0.9), "task 't' trains with sgd momentum 0.9"),
    ]:
        task = TaskSpec(name="t", optimizer=optimizer)
        federation = FederationInfo(1, (4,), (2,), SHAPE, tasks=(0,), task_specs=(task,))
        with pytest.raises(ValueError, match=message):
            algorithm.check_resources(federation, memory_budget=1e9)
    fine = TaskSpec(name="t", optimizer=OptimizerSpec("sgd"))
    federation = FederationInfo(1, (4,), (2,), SHAPE, tasks=(0,), task_specs=(fine,))
    algorithm.check_resources(federation, memory_budget=1e9)


def test_declared_toolbox_and_uplink():
    assert FedNova.toolbox == ("aggregation", "server_optimizer", "privacy", "uplink")
    assert FedNova.uplink_kinds == ("model",)
    assert isinstance(FedNova(FedNovaParams(), None).params, WholeModelParams)
