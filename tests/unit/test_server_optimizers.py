"""The server optimisers of raymtl.toolbox.server_optimizers (docs/ALGORITHMS.md §9.2) over
three rounds on a 2-element float64 model, against the formulas in plain Python floats."""

from __future__ import annotations

import io
import math

import pytest
import torch

from raymtl.toolbox.server_optimizers import STEPS, adaptive_lr, empty_state, server_step
from raymtl.toolbox.settings import OPTIMIZERS, ServerOptimizerSettings

W0 = [1.0, -2.0]
# The aggregates of rounds 1, 2, 3. With η = 0.01 the model moves by about 0.01 a round, so
# round 2's Δ on coordinate 0 is about 1.03 − 1.0098 ≈ 0.02: Δ² ≈ 0.0004 < v ≈ 0.0025, which
# turns Yogi's sign to +1 there (round 1's large Δ gives −1).
AGGREGATES = [[1.5, -3.0], [1.03, -1.0], [0.9, -1.5]]


def tensor(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def sign(x: float) -> float:
    return float((x > 0) - (x < 0))


def reference_adaptive(name: str, settings: ServerOptimizerSettings) -> list[list[float]]:
    """Reddi et al. 2021 Alg. 2, coordinate by coordinate in Python floats: w_1, w_2, w_3."""
    beta1, beta2 = settings.betas
    tau, lr = settings.tau, settings.step_size
    v_start = settings.v0 if settings.v0 is not None else tau**2
    w, m, v = list(W0), [0.0, 0.0], [v_start, v_start]
    history = []
    for t, aggregate in enumerate(AGGREGATES, start=1):
        lr_t = lr
        if settings.bias_correction:
            lr_t = lr * math.sqrt(1 - beta2 ** (t + 1)) / (1 - beta1 ** (t + 1))
        for i in range(2):
            delta = aggregate[i] - w[i]
            m[i] = beta1 * m[i] + (1 - beta1) * delta
            if name == "fedadagrad":
                v[i] = v[i] + delta * delta
            elif name == "fedyogi":
                v[i] = v[i] - (1 - beta2) * delta * delta * sign(v[i] - delta * delta)
            else:
                v[i] = beta2 * v[i] + (1 - beta2) * delta * delta
            w[i] = w[i] + lr_t * m[i] / (math.sqrt(v[i]) + tau)
        history.append(list(w))
    return history


def reference_momentum(settings: ServerOptimizerSettings) -> list[list[float]]:
    """Hsu et al. 2019 in Python floats: u_t = β·u_{t−1} + Δ_t, w_{t+1} = w_t + η·u_t."""
    w, u = list(W0), [0.0, 0.0]
    history = []
    for aggregate in AGGREGATES:
        for i in range(2):
            u[i] = settings.momentum * u[i] + (aggregate[i] - w[i])
            w[i] = w[i] + settings.step_size * u[i]
        history.append(list(w))
    return history


def run_rounds(settings: ServerOptimizerSettings) -> tuple[list[list[float]], dict]:
    weights, state = {"w": tensor(W0)}, {}
    history = []
    for aggregate in AGGREGATES:
        weights, state = server_step(settings, weights, {"w": tensor(aggregate)}, state)
        history.append(weights["w"].tolist())
    return history, state


def assert_rounds_equal(history, expected):
    for got, want in zip(history, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            assert a == pytest.approx(b, rel=1e-12, abs=0)


def test_every_optimiser_has_a_step():
    assert set(STEPS) == set(OPTIMIZERS)


def test_fedadam_round_one_by_hand():
    # Δ = [0.5, −1]; m = 0.1·Δ = [0.05, −0.1]
    # v = 0.99·τ² + 0.01·Δ² = 0.99e-6 + [0.0025, 0.01] = [0.00250099, 0.01000099]
    # √v = [0.0500099, 0.1000049]; η·m/(√v + τ) = [0.01·0.05/0.0510099, −0.01·0.1/0.1010049]
    #    = [0.0098020, −0.0099005]
    settings = ServerOptimizerSettings(name="fedadam")
    weights, state = server_step(settings, {"w": tensor(W0)}, {"w": tensor([1.5, -3.0])}, {})
    assert weights["w"].tolist() == pytest.approx([1.0098020, -2.0099005], abs=1e-7)
    assert state["m"]["w"].tolist() == pytest.approx([0.05, -0.1], rel=1e-12)
    assert state["v"]["w"].tolist() == pytest.approx([0.00250099, 0.01000099], rel=1e-12)
    assert state["steps"] == 1


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_adaptive_three_rounds(name):
    settings = ServerOptimizerSettings(name=name)
    history, state = run_rounds(settings)
    assert_rounds_equal(history, reference_adaptive(name, settings))
    assert state["steps"] == 3


def test_fedyogi_sign_changes_direction():
    # Yogi's v on coordinate 0: round 1 sign(τ² − 0.25) = −1, v grows to τ² + 0.01·0.25;
    # round 2 Δ² ≈ 0.0004 < v: sign +1, v shrinks by 0.01·Δ² (Adam's would shrink by 1%).
    settings = ServerOptimizerSettings(name="fedyogi")
    weights, state = server_step(settings, {"w": tensor(W0)}, {"w": tensor(AGGREGATES[0])}, {})
    v1 = state["v"]["w"][0].item()
    assert v1 == pytest.approx(1e-6 + 0.01 * 0.25, rel=1e-12)
    delta2 = AGGREGATES[1][0] - weights["w"][0].item()
    _, state = server_step(settings, weights, {"w": tensor(AGGREGATES[1])}, state)
    assert state["v"]["w"][0].item() == pytest.approx(v1 - 0.01 * delta2**2, rel=1e-12)


def test_fedadam_flower_variant_v0_zero_and_bias_correction():
    # round 1: η_1 = 0.01·√(1 − 0.99²)/(1 − 0.9²) = 0.01·√0.0199/0.19 = 0.01·0.1410674/0.19
    #   = 0.0074246; v = 0.01·Δ² = [0.0025, 0.01], √v = [0.05, 0.1]
    #   step = η_1·[0.05/0.051, −0.1/0.101] = [0.0072790, −0.0073511]
    settings = ServerOptimizerSettings(name="fedadam", v0=0.0, bias_correction=True)
    assert adaptive_lr(settings, 1) == pytest.approx(0.0074246, abs=1e-7)
    history, _ = run_rounds(settings)
    assert history[0] == pytest.approx([1.0072790, -2.0073511], abs=1e-7)
    assert_rounds_equal(history, reference_adaptive("fedadam", settings))


def test_adaptive_with_explicit_settings():
    settings = ServerOptimizerSettings(
        name="fedadagrad", lr=0.3, betas=(0.5, 0.9), tau=0.1, v0=0.04, bias_correction=True
    )
    history, _ = run_rounds(settings)
    assert_rounds_equal(history, reference_adaptive("fedadagrad", settings))


def test_momentum_by_hand_and_three_rounds():
    # β = 0.9, η = 1: u_1 = Δ_1 = [0.5, −1], w_1 = w_0 + u_1 = the aggregate [1.5, −3];
    # Δ_2 = [1.03 − 1.5, −1 + 3] = [−0.47, 2], u_2 = 0.9·[0.5, −1] + Δ_2 = [−0.02, 1.1],
    # w_2 = [1.48, −1.9]
    settings = ServerOptimizerSettings(name="momentum")
    history, state = run_rounds(settings)
    assert history[0] == pytest.approx([1.5, -3.0], rel=1e-12)
    assert history[1] == pytest.approx([1.48, -1.9], rel=1e-12)
    assert_rounds_equal(history, reference_momentum(settings))
    assert state["steps"] == 3
    slow = ServerOptimizerSettings(name="momentum", momentum=0.5, lr=0.25)
    assert_rounds_equal(run_rounds(slow)[0], reference_momentum(slow))


def test_none_returns_the_aggregate():
    combined = {"w": tensor([1.5, -3.0])}
    state = {}
    weights, new_state = server_step(ServerOptimizerSettings(), {"w": tensor(W0)}, combined, state)
    assert weights is combined
    assert new_state is state


def test_only_the_aggregates_float_names_are_stepped():
    settings = ServerOptimizerSettings(name="momentum")
    frozen = tensor([7.0])
    weights = {"w": tensor(W0), "frozen": frozen, "count": torch.tensor(4)}
    combined = {"w": tensor([1.5, -3.0]), "count": torch.tensor(6)}
    state = empty_state()
    next_weights, new_state = server_step(settings, weights, combined, state)
    assert next_weights["frozen"] is frozen  # not in the aggregate: kept
    assert next_weights["count"].item() == 6  # an integer buffer: the aggregate's
    assert next_weights["w"].tolist() == [1.5, -3.0]
    assert list(new_state["u"]) == ["w"]
    assert state == empty_state()  # the caller's state is not modified


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad", "momentum"])
def test_state_survives_a_weights_only_checkpoint(name):
    settings = ServerOptimizerSettings(name=name)
    weights, state = {"w": tensor(W0)}, {}
    for aggregate in AGGREGATES[:2]:
        weights, state = server_step(settings, weights, {"w": tensor(aggregate)}, state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=True)
    assert restored["steps"] == 2 and isinstance(restored["steps"], int)
    last = {"w": tensor(AGGREGATES[2])}
    resumed, _ = server_step(settings, weights, last, restored)
    straight, _ = server_step(settings, weights, last, state)
    assert torch.equal(resumed["w"], straight["w"])
    assert_rounds_equal([resumed["w"].tolist()], [run_rounds(settings)[0][2]])
