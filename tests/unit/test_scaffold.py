"""The SCAFFOLD example (examples/scaffold/scaffold.py, `scaffold_samples`, loaded as a plugin
is): a subclass of the built-in SCAFFOLD whose server weights both means by the clients'
samples. Its server step and a whole round on numbers worked out by hand; with equal n_i the
built-in's plain means; everything else the built-in's, under a name that does not clash
with it. The built-in `scaffold` itself (plain means): test_scaffold_builtin.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raymtl.extend import (
    SERVER,
    ClientData,
    FederationInfo,
    Message,
    Scaffold,
    State,
    StepContext,
    load_received,
    weighted_average,
)
from raymtl.plugins import load_plugin
from raymtl.tasks.spec import TaskSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scaffold" / "scaffold.py"
MSE = TaskSpec(name="y", targets="y", loss="mse", outputs=1, metrics=("mse",))


@pytest.fixture(scope="module")
def scaffold():
    """The example's module, imported as an experiment's `plugins: [.../scaffold.py]` does."""
    return load_plugin(str(EXAMPLE))


def linear(*values: float) -> nn.Module:
    """A model whose only parameter is `weight`, shape (1, len(values))."""
    model = nn.Linear(len(values), 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([values]))
    return model


def weight(*values: float) -> dict[str, torch.Tensor]:
    return {"weight": torch.tensor([values])}


def server_context(samples: tuple[int, ...], sampled=(0, 1)) -> StepContext:
    federation = FederationInfo(len(samples), samples, (1,) * len(samples), (1, 1, 1))
    return StepContext(SERVER, 1, 5, 0, tuple(sampled), federation)


def server_step(algorithm, x, c, uploads, samples) -> tuple[torch.Tensor, torch.Tensor]:
    """The algorithm's `aggregate` on a server holding x and c, its inbox the (y_i, Δc_i) of
    `uploads` (client i: the i-th); returns (x', c')."""
    server = State(model=linear(*x), extras={"control": weight(*c)})
    inbox = []
    for i, (y, delta) in enumerate(uploads):
        inbox.append(Message(f"client/{i}", SERVER, "model", weight(*y)))
        inbox.append(Message(f"client/{i}", SERVER, "control", weight(*delta)))
    algorithm.aggregate(server, inbox, server_context(samples, range(len(uploads))))
    return server.model.weight.detach()[0], server.extras["control"]["weight"][0]


def test_the_server_step_is_weighted_by_samples_by_hand(scaffold):
    """x = [1, -2], c = [0.1, 0.2], η_g = 0.5; clients 0 and 1 of 4 upload, n = (1, 3, 2, 2)."""
    plugin = scaffold.ScaffoldSamples(Scaffold.Params(server_lr=0.5), None)
    uploads = [((2.0, 0.0), (0.4, -0.8)), ((0.5, -1.0), (0.2, 0.4))]
    x, c = server_step(plugin, (1.0, -2.0), (0.1, 0.2), uploads, samples=(1, 3, 2, 2))
    # Δy = [1, 2] and [-0.5, 1]; n_S = 4: Σ (n_i/n_S)·Δy_i = ([1, 2] + 3·[-0.5, 1])/4
    # = [-0.125, 1.25];  x' = x + 0.5·[-0.125, 1.25] = [0.9375, -1.375]
    torch.testing.assert_close(x, torch.tensor([0.9375, -1.375]))
    # n = 8: c' = c + (1/8)·[0.4, -0.8] + (3/8)·[0.2, 0.4] = [0.1 + 0.05 + 0.075, 0.2 − 0.1 + 0.15]
    torch.testing.assert_close(c, torch.tensor([0.225, 0.25]))
    # The built-in on the same inbox, plain means: x' = x + 0.5·mean(Δy_i) = x + 0.5·[0.25, 1.5]
    # = [1.125, -1.25];  c' = c + (1/4)·([0.4, -0.8] + [0.2, 0.4]) = [0.25, 0.1]
    builtin = Scaffold(Scaffold.Params(server_lr=0.5), None)
    x, c = server_step(builtin, (1.0, -2.0), (0.1, 0.2), uploads, samples=(1, 3, 2, 2))
    torch.testing.assert_close(x, torch.tensor([1.125, -1.25]))
    torch.testing.assert_close(c, torch.tensor([0.25, 0.1]))


def test_with_server_lr_one_x_is_fedavgs_average_bit_for_bit(scaffold):
    """η_g = 1: x' is the sample-weighted average of the y_i (FedAvg's `weighted_average`)
    to the bit; a client whose Δc_i is not finite is left out of both sums."""
    plugin = scaffold.ScaffoldSamples(Scaffold.Params(), None)
    ys = [(0.3, 1e-8), (-0.7, 0.1), (9.0, 9.0)]
    deltas = [(0.2, 0.6), (0.4, -0.3), (float("nan"), 0.0)]
    uploads = list(zip(ys, deltas, strict=True))
    x, c = server_step(plugin, (1.0, 3e-8), (0.0, 0.0), uploads, samples=(2, 5, 7, 6))
    fedavg = weighted_average([(weight(*ys[0]), 2), (weight(*ys[1]), 5)])
    assert torch.equal(x, fedavg["weight"][0])
    # n = 20: c' = (2/20)·[0.2, 0.6] + (5/20)·[0.4, -0.3] = [0.12, -0.015]
    torch.testing.assert_close(c, torch.tensor([0.12, -0.015]))


@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_with_equal_samples_it_is_the_builtins_plain_means(scaffold, server_lr):
    """Every n_i equal: w_i/Σ_S w = 1/|S| and w_i/Σ w = 1/N, the paper's means. x' is the
    built-in's bit for bit; c' the same up to rounding (n·Δc_i/(n·N) against Δc_i/N)."""
    generator = torch.Generator().manual_seed(0)
    x, c = torch.randn(2, generator=generator).tolist(), (0.3, -0.1)
    uploads = [
        (torch.randn(2, generator=generator).tolist(), torch.randn(2, generator=generator).tolist())
        for _ in range(3)
    ]
    settings = Scaffold.Params(server_lr=server_lr)
    plugin = server_step(scaffold.ScaffoldSamples(settings, None), x, c, uploads, (7,) * 5)
    builtin = server_step(Scaffold(settings, None), x, c, uploads, (7,) * 5)
    assert torch.equal(plugin[0], builtin[0])
    torch.testing.assert_close(plugin[1], builtin[1])
    federation = server_context((7,) * 5).federation
    assert Scaffold(settings, None).mean_weights(federation) == [1.0] * 5
    assert scaffold.ScaffoldSamples(settings, None).mean_weights(federation) == [7.0] * 5


def regression(samples: int) -> ClientData:
    """x = 1, y = 0 for every sample: f(w) = w², g(w) = 2w whatever the batch."""
    x, y = torch.ones(samples, 1), torch.zeros(samples, 1)
    return ClientData(x, y, x, y, 1, (1, 1, 1), task=MSE)


def test_a_whole_round_by_hand(scaffold):
    """The inherited steps, broadcast → train → aggregate, on a one-weight model; x = 1,
    c = c_i = 0, η_l = 0.1, η_g = 1, batches of one, n = (2, 3, 5, 5), clients 0 and 1 sampled.
    client 0, K = 2: y = 1 → 0.8 → 0.64;  c_0⁺ = (1 − 0.64)/(2·0.1) = 1.8
    client 1, K = 3: y = 1 → 0.8 → 0.64 → 0.512;  c_1⁺ = (1 − 0.512)/(3·0.1) = 1.62667
    x ← (2·0.64 + 3·0.512)/5 = 0.5632 (the built-in's plain mean: 0.576)
    c ← (2·1.8 + 3·1.62667)/15 = (3.6 + 4.88)/15 = 0.56533 (the built-in's: 3.42667/4)"""
    samples = (2, 3, 5, 5)
    algorithm = scaffold.ScaffoldSamples(
        Scaffold.Params(epochs=1, batch_size=1, lr=0.1), lambda who, classes: linear(1.0)
    )
    federation = server_context(samples).federation
    server = algorithm.init_state(SERVER, None, federation)
    _, down = algorithm.broadcast(server, [], server_context(samples))
    up = []
    for k in (0, 1):
        me = f"client/{k}"
        client = algorithm.init_state(me, regression(samples[k]), federation)
        ctx = StepContext(me, 1, 5, 0, (0, 1), federation)
        _, outbox = algorithm.train(client, [m for m in down if m.dst == me], ctx)
        up += outbox
    algorithm.aggregate(server, up, server_context(samples))
    assert float(server.model.weight.detach()) == pytest.approx(0.5632, abs=1e-7)
    control = float(server.extras["control"]["weight"])
    assert control == pytest.approx((2 * 1.8 + 3 * 0.488 / 0.3) / 15, abs=1e-6)


def test_the_plugin_registers_beside_the_builtin(scaffold):
    """Its own name: the built-in `scaffold` stays the built-in, with its plain means."""
    from raymtl.algorithms import get_algorithm

    plugin = scaffold.ScaffoldSamples
    assert plugin.name == "scaffold_samples" and Scaffold.name == "scaffold"
    assert get_algorithm("scaffold_samples") is plugin
    assert get_algorithm("scaffold") is Scaffold
    assert Scaffold.__module__ == "raymtl.algorithms.scaffold"
    assert Scaffold.mean_weights is not plugin.mean_weights


def test_it_changes_the_weights_alone(scaffold):
    """Everything but `mean_weights` (and its name) is the built-in's: Params and their
    refusals, the round, what a client keeps, the toolbox it takes and refuses."""
    plugin = scaffold.ScaffoldSamples
    assert {key for key in vars(plugin) if not key.startswith("__")} == {
        "name",
        "summary",
        "mean_weights",
    }
    assert plugin.Params is Scaffold.Params and plugin.keeps == ("extras",)
    assert plugin.toolbox == ("aggregation", "server_optimizer", "uplink")
    assert "privacy" in plugin.toolbox_refusals
    with pytest.raises(ValidationError, match="momentum: SCAFFOLD's correction needs plain SGD"):
        plugin.Params(momentum=0.9)


def test_load_received_loads_only_the_kinds_it_is_given():
    """SCAFFOLD's inbox: the global model and the control variate c, under the same names."""
    model = linear(0.0)
    inbox = [
        Message("server", "client/0", "global_model", {"weight": torch.tensor([[1.0]])}),
        Message("server", "client/0", "control", {"weight": torch.tensor([[7.0]])}),
    ]
    load_received(model, inbox, kinds=("global_model",))
    assert model.weight.item() == 1.0  # c did not overwrite the weights
    single = linear(0.0)
    load_received(single, inbox, kinds="global_model")  # one kind may be given as a str
    assert single.weight.item() == 1.0
    load_received(model, inbox)  # the default: every message, in inbox order
    assert model.weight.item() == 7.0
