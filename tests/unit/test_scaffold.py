"""The SCAFFOLD example's maths on numbers worked out by hand (examples/scaffold/scaffold.py,
the sample-weighted `scaffold_samples`, loaded as a plugin is): option II's control-variate
update, the server's update, the corrected local step, what its Params and check_resources
refuse, and `load_received` loading only the kinds it is given. The built-in `scaffold`
(plain means): test_scaffold_builtin.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raymtl.extend import ClientData, FederationInfo, Message, load_received
from raymtl.plugins import load_plugin
from raymtl.tasks.spec import OptimizerSpec, TaskSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scaffold" / "scaffold.py"


@pytest.fixture(scope="module")
def scaffold():
    """The example's module, imported as an experiment's `plugins: [.../scaffold.py]` does."""
    return load_plugin(str(EXAMPLE))


def vector(*values: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values)}


def test_client_control_update_by_hand(scaffold):
    c_i, c = vector(0.5, -1.0), vector(0.25, 0.5)
    x, y = vector(1.0, 2.0), vector(0.6, 2.4)
    new_c_i, delta = scaffold.client_control_update(c_i, c, x, y, steps=4, lr=0.1)
    # (x − y)/(K·η_l) = [0.4, -0.4]/0.4 = [1, -1]
    # c_i⁺ = c_i − c + [1, -1] = [0.5 − 0.25 + 1, -1 − 0.5 − 1] = [1.25, -2.5]
    # Δc_i = c_i⁺ − c_i = [0.75, -1.5]
    torch.testing.assert_close(new_c_i["w"], torch.tensor([1.25, -2.5]))
    torch.testing.assert_close(delta["w"], torch.tensor([0.75, -1.5]))
    # No local step (no training samples): c_i stays, Δc_i = 0.
    same, nothing = scaffold.client_control_update(c_i, c, x, x, steps=0, lr=0.1)
    assert torch.equal(same["w"], c_i["w"]) and torch.equal(nothing["w"], torch.zeros(2))


def test_server_update_by_hand(scaffold):
    x, c = vector(1.0, -2.0), vector(0.1, 0.2)
    updates = [  # (y_i, Δc_i, n_i) of the 2 sampled clients; the other clients hold 4 samples
        (vector(2.0, 0.0), vector(0.4, -0.8), 1),
        (vector(0.5, -1.0), vector(0.2, 0.4), 3),
    ]
    new_x, new_c = scaffold.server_update(x, c, updates, total_samples=8, server_lr=0.5)
    # Δy = [1, 2] and [-0.5, 1]; mean weighted by n_i: ([1, 2] + 3·[-0.5, 1])/4 = [-0.125, 1.25]
    # x' = x + 0.5·[-0.125, 1.25] = [0.9375, -1.375]
    torch.testing.assert_close(new_x["w"], torch.tensor([0.9375, -1.375]))
    # c' = c + (1/8)·[0.4, -0.8] + (3/8)·[0.2, 0.4] = [0.1 + 0.05 + 0.075, 0.2 − 0.1 + 0.15]
    torch.testing.assert_close(new_c["w"], torch.tensor([0.225, 0.25]))


def test_server_update_with_equal_samples_is_the_papers_and_fedavgs(scaffold):
    """Equal n_i: c' = c + (|S|/N)·mean(Δc_i). η_g = 1: x' is FedAvg's average bit for bit.
    A client whose Δc_i is not finite is left out of both sums."""
    x, c = vector(1.0, 3e-8), vector(0.0, 0.0)
    updates = [
        (vector(0.3, 1e-8), vector(0.2, 0.6), 5),
        (vector(-0.7, 0.1), vector(0.4, -0.3), 5),
        (vector(9.0, 9.0), vector(float("nan"), 0.0), 5),
    ]
    new_x, new_c = scaffold.server_update(x, c, updates, total_samples=20, server_lr=1.0)
    fedavg = updates[0][0]["w"] * 0.5 + updates[1][0]["w"] * 0.5  # weighted_average's sum
    assert torch.equal(new_x["w"], fedavg)
    # |S| = 2 usable of N = 4 clients: c' = (2/4)·mean([0.2, 0.6], [0.4, -0.3]) = [0.15, 0.075]
    torch.testing.assert_close(new_c["w"], torch.tensor([0.15, 0.075]))
    nothing = [(vector(float("inf"), 0.0), vector(0.0, 0.0), 5)]
    assert scaffold.server_update(x, c, nothing, 20, 1.0) == (x, c)  # unchanged


def one_weight_model(value: float) -> nn.Module:
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


def test_corrected_sgd_steps_by_the_corrected_gradient_and_option_ii_is_its_mean(scaffold):
    """Two samples x = 1, y = 0 under MSE, one a batch: loss w², gradient g(w) = 2w."""
    ones, zeros = torch.ones(2, 1), torch.zeros(2, 1)
    mse = TaskSpec(name="t", targets="t", loss="mse", outputs=1)
    data = ClientData(ones, zeros, ones, zeros, 1, (1, 1, 1), mse)
    params = scaffold.ScaffoldParams(epochs=1, batch_size=1, lr=0.1)
    model = one_weight_model(1.0)
    c, c_i = {"weight": torch.tensor([[0.5]])}, {"weight": torch.tensor([[0.25]])}
    correction = {"weight": c["weight"] - c_i["weight"]}
    loss, steps = scaffold.corrected_sgd(model, data, params, seed=0, correction=correction)
    # w1 = 1 − 0.1·(2·1 + 0.25) = 0.775;  w2 = 0.775 − 0.1·(2·0.775 + 0.25) = 0.595
    # task losses 1² and 0.775² = 0.600625: mean 0.8003125
    assert steps == 2
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[0.595]]))
    assert loss == pytest.approx(0.8003125)
    new_c_i, _ = scaffold.client_control_update(
        c_i, c, {"weight": torch.ones(1, 1)}, {"weight": model.weight.detach()}, steps, 0.1
    )
    # c_i⁺ = 0.25 − 0.5 + (1 − 0.595)/(2·0.1) = 1.775 = mean(g(1), g(0.775)) = (2 + 1.55)/2
    torch.testing.assert_close(new_c_i["weight"], torch.tensor([[1.775]]))


def test_the_plugin_registers_beside_the_builtin(scaffold):
    """The example's name does not clash with the built-in SCAFFOLD's."""
    from raymtl.algorithms import get_algorithm

    assert scaffold.Scaffold.name == "scaffold_samples"
    assert get_algorithm("scaffold_samples") is scaffold.Scaffold
    assert get_algorithm("scaffold").__module__ == "raymtl.algorithms.scaffold"


def test_a_zero_correction_is_plain_sgd_bit_for_bit(scaffold):
    """c = c_i = 0 (round 1): the step is `local_sgd`'s, so round 1 is FedAvg's."""
    from raymtl.extend import local_sgd

    x = torch.linspace(-1, 1, 12).reshape(6, 2)
    data = ClientData(x, torch.tensor([0, 1, 2, 0, 1, 2]), x, x, 3, (1, 1, 2))
    params = scaffold.ScaffoldParams(epochs=2, batch_size=4, lr=0.3, weight_decay=0.01)
    corrected, plain = nn.Linear(2, 3), nn.Linear(2, 3)
    plain.load_state_dict(corrected.state_dict())
    zero = scaffold.zero_control(corrected)
    scaffold.corrected_sgd(corrected, data, params, seed=7, correction=zero)
    local_sgd(plain, data.train_x, data.train_y, params, seed=7)
    expected = plain.state_dict()
    for name, value in corrected.state_dict().items():
        assert torch.equal(value, expected[name]), name


@pytest.mark.parametrize(
    ("settings", "field"), [({"momentum": 0.9}, "momentum"), ({"clip_grad": 1.0}, "clip_grad")]
)
def test_params_refuse_what_is_not_plain_sgd(scaffold, settings, field):
    with pytest.raises(ValidationError, match=f"{field}: SCAFFOLD's correction needs plain SGD"):
        scaffold.ScaffoldParams(**settings)
    assert scaffold.ScaffoldParams(weight_decay=1e-4).weight_decay == 1e-4  # part of g_i


def federation_of(task: TaskSpec) -> FederationInfo:
    return FederationInfo(2, (10, 10), (3, 3), (1, 8, 8), tasks=(0, 0), task_specs=(task,))


def test_a_task_optimiser_other_than_plain_sgd_is_refused(scaffold):
    algorithm = scaffold.Scaffold(scaffold.ScaffoldParams(), None)
    adam = TaskSpec(name="faces", optimizer=OptimizerSpec("adam", lr=1e-3))
    with pytest.raises(
        ValueError, match="task 'faces' trains with adam; SCAFFOLD's correction needs plain SGD"
    ):
        algorithm.check_resources(federation_of(adam), memory_budget=1e9)
    heavy = TaskSpec(name="t", optimizer=OptimizerSpec("sgd", momentum=0.9))
    with pytest.raises(ValueError, match="task 't' trains with sgd with momentum 0.9; "):
        algorithm.check_resources(federation_of(heavy), memory_budget=1e9)
    for fine in (TaskSpec(), TaskSpec(optimizer=OptimizerSpec("sgd", weight_decay=0.1))):
        algorithm.check_resources(federation_of(fine), memory_budget=1e9)


def test_load_received_loads_only_the_kinds_it_is_given():
    """SCAFFOLD's inbox: the global model and the control variate c, under the same names."""
    model = one_weight_model(0.0)
    inbox = [
        Message("server", "client/0", "global_model", {"weight": torch.tensor([[1.0]])}),
        Message("server", "client/0", "control", {"weight": torch.tensor([[7.0]])}),
    ]
    load_received(model, inbox, kinds=("global_model",))
    assert model.weight.item() == 1.0  # c did not overwrite the weights
    single = one_weight_model(0.0)
    load_received(single, inbox, kinds="global_model")  # one kind may be given as a str
    assert single.weight.item() == 1.0
    load_received(model, inbox)  # the default: every message, in inbox order
    assert model.weight.item() == 7.0
