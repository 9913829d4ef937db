"""Sheaf-FMTL's maths on hand-made tensors, its equivalence to dFedU, its maps' draw (the
reference stream, N(0, σ²)), a round against the spec computed from scratch, and its memory
check."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from raymtl.algorithms.base import (
    FederationInfo,
    Message,
    State,
    StepContext,
    client_name,
    payload_bits,
)
from raymtl.algorithms.registry import get_algorithm
from raymtl.algorithms.sheaf_fmtl import SENT, draw_map, interaction_dim
from raymtl.algorithms.training import derive_seed
from raymtl.config import ConfigError, parse_config
from raymtl.models import build_model
from raymtl.runtime.hosts.compute import precision
from tests.conftest import digits_experiment

# A path 0 - 1 - 2 (mixing weights are not used by Sheaf-FMTL, only who is a neighbour).
PATH = FederationInfo(
    3, (1, 1, 1), (1, 1, 1), (1, 1, 1), mixing={0: {1: 1}, 1: {0: 1, 2: 1}, 2: {1: 1}}
)


def sheaf(**params):
    cls = get_algorithm("sheaf_fmtl")
    return cls(cls.Params(**params), model_factory=None)


def tiny_model(theta):
    """logreg on one input pixel, one output: θ = (head.bias, head.weight) in name order."""
    model = build_model("logreg", (1, 1, 1), 1)
    with torch.no_grad():
        model.head.bias.fill_(theta[0])
        model.head.weight.fill_(theta[1])
    return model


def projection(src: str, value: float) -> Message:
    return Message(src, "client/1", "projection", {"projection": torch.tensor([value])})


def context(me, round_index=2, seed=0):
    return StepContext(me, round_index, 5, seed, (0, 1, 2), PATH)


def test_theta_step_by_hand():
    """θ_1 ← θ_1 − α·λ·Σ_j P_1jᵀ(P_1j θ_1 − P_j1 θ_j), with 1×2 maps."""
    algorithm = sheaf(lr=0.5, lam=2.0)
    maps = {0: torch.tensor([[1.0, 0.0]]), 2: torch.tensor([[0.0, 2.0]])}
    state = State(model=tiny_model((1.0, 3.0)), extras={"maps": maps})
    inbox = [projection("client/0", 4.0), projection("client/2", 5.0)]
    state, outbox = algorithm.theta_step(state, inbox, context("client/1"))
    # gaps: P_10 θ = 1 → 1 − 4 = −3;  P_12 θ = 6 → 6 − 5 = 1
    # Σ Pᵀ gap = (−3, 0) + (0, 2) = (−3, 2);  θ ← (1, 3) − 0.5·2·(−3, 2) = (4, 1)
    assert algorithm.flat_theta(state.model).tolist() == [4.0, 1.0]
    assert [(m.dst, m.tensors["projection"].tolist()) for m in outbox] == [
        ("client/0", [4.0]),
        ("client/2", [2.0]),
    ]  # the new P_1j θ_1


def test_map_step_by_hand():
    """P_1j ← P_1j − η·λ·(P_1j θ_1 − P_j1 θ_j)·θ_1ᵀ with the new values."""
    algorithm = sheaf(map_lr=0.1, lam=2.0)
    maps = {0: torch.tensor([[1.0, 0.0]]), 2: torch.tensor([[0.0, 2.0]])}
    state = State(model=tiny_model((4.0, 1.0)), extras={"maps": maps})
    inbox = [projection("client/0", 3.0), projection("client/2", 2.0)]
    ctx = context("client/1")
    state, outbox = algorithm.map_step(state, inbox, ctx)
    # gap_0 = 4 − 3 = 1: P_10 − 0.2·1·(4, 1) = (0.2, −0.2);  gap_2 = 2 − 2 = 0: unchanged
    assert torch.allclose(state.extras["maps"][0], torch.tensor([[0.2, -0.2]]))
    assert torch.equal(state.extras["maps"][2], torch.tensor([[0.0, 2.0]]))
    assert outbox == [] and [row["j"] for table, row in ctx.records if table == "maps"] == [0, 2]


def test_interaction_dims_and_memory():
    assert interaction_dim(34_826, 34_826, 0.01) == 348
    assert interaction_dim(1000, 30, 0.1) == 3 and interaction_dim(10, 10, 0.01) == 1
    dims = [100, 200, 50]
    # client 1 holds P_10 (⌊0.1·100⌋ × 200) and P_12 (⌊0.1·50⌋ × 200) of float32
    expected = [4 * 10 * 100, 4 * (10 * 200 + 5 * 200), 4 * 5 * 50]
    assert sheaf(gamma=0.1).persistent_bytes(dims, PATH) == expected


def test_a_run_over_the_memory_budget_is_refused_with_its_knobs(tmp_path, capsys):
    from raymtl.runtime.executors.planning import check_federation

    settings = {"algorithm.name": "sheaf_fmtl", "runtime.memory_budget": "10KB"}
    with pytest.raises(ConfigError) as error:
        check_federation(parse_config(digits_experiment(tmp_path, **settings)))
    line = str(error.value)
    assert line.startswith("runtime.memory_budget: sheaf_fmtl needs") and "over 0.00 GB" in line
    assert "gamma" in line and "map_params" in line and "\n" not in line
    # The refusal is the only line: the estimate is printed only when the run goes ahead.
    assert "per-client state needs" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match="is not a size"):
        check_federation(
            parse_config(
                digits_experiment(tmp_path, **{**settings, "runtime.memory_budget": "ten"})
            )
        )


def test_identity_maps_need_gamma_one():
    algorithm = sheaf(map_init="identity", gamma=0.5)
    state = State(model=tiny_model((0.0, 0.0)))
    inbox = [Message("client/0", "client/1", "dim", {"dim": torch.tensor([2])})]
    with pytest.raises(ValueError, match="identity needs"):
        algorithm.init_maps(state, inbox, context("client/1"))


def test_a_cluster_run_is_held_to_what_ray_reports(tmp_path, capsys):
    from raymtl.runtime.executors.planning import check_federation, check_memory

    settings = {"algorithm.name": "sheaf_fmtl", "runtime.address": "auto"}
    cfg = parse_config(digits_experiment(tmp_path, **settings))
    plan = check_federation(cfg)  # before connecting: printed, not refused
    assert "budget no limit" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="runtime.memory_budget: sheaf_fmtl needs"):
        check_memory(plan, reported=1000)  # what a (tiny) cluster reported


def test_a_step_recomputes_what_an_earlier_round_kept():
    """P_ij θ_i kept from another round is never used as this round's (θ has moved since)."""
    algorithm = sheaf(lr=0.5, lam=2.0)
    maps = {0: torch.tensor([[1.0, 0.0]]), 2: torch.tensor([[0.0, 2.0]])}
    stale = (1, {0: torch.tensor([100.0]), 2: torch.tensor([-100.0])})
    state = State(model=tiny_model((1.0, 3.0)), extras={"maps": maps, SENT: stale})
    inbox = [projection("client/0", 4.0), projection("client/2", 5.0)]
    state, _ = algorithm.theta_step(state, inbox, context("client/1"))
    assert algorithm.flat_theta(state.model).tolist() == [4.0, 1.0]  # as test_theta_step_by_hand


# -- the maps' draw ---------------------------------------------------------------------------
def dims_inbox(me: int, dims: dict[int, int]) -> list[Message]:
    """Round 1's announcements: neighbour j's d_j."""
    return [
        Message(client_name(j), client_name(me), "dim", {"dim": torch.tensor([d])})
        for j, d in dims.items()
    ]


def test_maps_are_the_reference_stream_for_each_edge_and_reproducible():
    """P_ij: bit for bit torch.randn(d_ij, d_i)·σ of a generator seeded with derive_seed(seed,
    "map", i, j), the draw before draw_map, on both sides of torch's 16-entry threshold."""
    for rows, cols in ((1, 1), (3, 5), (4, 4), (20, 500)):
        for seed in (0, 7):
            generator = torch.Generator().manual_seed(seed)
            reference = torch.randn(rows, cols, generator=generator).mul_(0.01)
            assert torch.equal(draw_map(rows, cols, 0.01, seed), reference)
    algorithm = sheaf(gamma=0.5, init_std=0.1)
    model = build_model("logreg", (1, 2, 2), 3)  # d = 3·4 + 3 = 15: d_ij = ⌊0.5·15⌋ = 7
    drawn = []
    for seed in (0, 0, 1):
        state, ctx = State(model=model), context("client/1", round_index=1, seed=seed)
        algorithm.init_maps(state, dims_inbox(1, {0: 15, 2: 15}), ctx)
        drawn.append(state.extras["maps"])
        [(table, row)] = ctx.records
        assert table == "map_draws" and (row["i"], row["maps"]) == (1, 2)
        assert row["bytes"] == 4 * 2 * 7 * 15 and row["seconds"] >= 0
    for j in (0, 2):
        expected = draw_map(7, 15, 0.1, derive_seed(0, "map", "client/1", j))
        assert torch.equal(drawn[0][j], expected) and torch.equal(drawn[1][j], expected)
        assert not torch.equal(drawn[2][j], expected)  # another seed, another map
    assert not torch.equal(drawn[0][0], drawn[0][2])  # one generator per edge


def test_map_entries_are_normal_with_the_given_std():
    """400,000 entries of N(0, σ²): mean, std, kurtosis and the mass within one σ within four
    standard errors of the normal's, and a Kolmogorov–Smirnov test that does not reject it."""
    from scipy import stats

    z = draw_map(400, 1000, 0.01, seed=3).double().flatten() / 0.01
    n = z.numel()
    assert abs(float(z.mean())) < 4 / n**0.5
    assert abs(float(z.std()) - 1) < 4 * (0.5 / n) ** 0.5
    assert abs(float((z**4).mean()) - 3) < 4 * (96 / n) ** 0.5
    within = float((z.abs() < 1).double().mean())
    assert abs(within - 0.682689) < 4 * (0.682689 * 0.317311 / n) ** 0.5
    assert stats.kstest(z.numpy(), "norm").pvalue > 0.01


# -- a round against the spec -----------------------------------------------------------------
def spec_round(lr, lam, eta, thetas, maps):
    """Steps 2-3 after training, as the code computed them before it kept P_ij θ_i: every
    product recomputed where it is used. Returns (θ, maps, the θ-step's P_ij θ_i)."""
    sent = {i: {j: maps[i][j] @ thetas[i] for j in sorted(maps[i])} for i in thetas}
    new_thetas = {}
    for i, theta in thetas.items():
        gradient = torch.zeros_like(theta)
        for j in sorted(maps[i]):
            gradient += maps[i][j].T @ (maps[i][j] @ theta - sent[j][i])
        new_thetas[i] = theta - lr * lam * gradient
    sent = {i: {j: maps[i][j] @ new_thetas[i] for j in sorted(maps[i])} for i in thetas}
    new_maps = {i: {j: m.clone() for j, m in maps[i].items()} for i in maps}
    for i, theta in new_thetas.items():
        for j in sorted(maps[i]):
            gap = maps[i][j] @ theta - sent[j][i]
            new_maps[i][j].addr_(gap, theta, alpha=-eta * lam)
    return new_thetas, new_maps, sent


def deliver(outboxes: dict[int, list[Message]]) -> dict[int, list[Message]]:
    inboxes = {i: [] for i in outboxes}
    for outbox in outboxes.values():
        for message in outbox:
            inboxes[int(message.dst.split("/")[1])].append(message)
    return inboxes


def path_of_three(algorithm, seed: int):
    """Three logreg clients on PATH with seeded random weights and their maps made: (states,
    contexts, θ_i, a copy of the maps as they start)."""
    generator = torch.Generator().manual_seed(seed)
    states, ctxs = {}, {}
    for i in range(3):
        model = build_model("logreg", (1, 2, 2), 3)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        states[i], ctxs[i] = State(model=model), context(client_name(i), round_index=1)
        algorithm.init_maps(states[i], dims_inbox(i, {j: 15 for j in PATH.neighbours(i)}), ctxs[i])
    thetas = {i: algorithm.flat_theta(s.model) for i, s in states.items()}
    maps = {i: {j: m.clone() for j, m in s.extras["maps"].items()} for i, s in states.items()}
    return states, ctxs, thetas, maps


def test_a_round_is_the_spec_bit_for_bit():
    """Three clients on a path, random θ and maps (γ = 0.5): θ-step, map step and the values
    sent equal the spec computed from scratch, exactly; nothing is left kept after the round."""
    lr, lam, eta = 0.5, 0.3, 0.2
    algorithm = sheaf(lr=lr, lam=lam, map_lr=eta, gamma=0.5, init_std=0.3)
    states, ctxs, thetas, maps = path_of_three(algorithm, seed=11)
    expected_thetas, expected_maps, expected_sent = spec_round(lr, lam, eta, thetas, maps)

    # the end of "train" (SGD aside): P_ij θ_i to each neighbour
    outboxes = {i: algorithm.projections(s, ctxs[i], thetas[i]) for i, s in states.items()}
    inboxes = deliver(outboxes)
    outboxes = {i: algorithm.theta_step(s, inboxes[i], ctxs[i])[1] for i, s in states.items()}
    for i, outbox in outboxes.items():
        for message in outbox:
            j = int(message.dst.split("/")[1])
            assert torch.equal(message.tensors["projection"], expected_sent[i][j])
    inboxes = deliver(outboxes)
    for i, state in states.items():
        algorithm.map_step(state, inboxes[i], ctxs[i])
        assert torch.equal(algorithm.flat_theta(state.model), expected_thetas[i])
        for j, matrix in state.extras["maps"].items():
            assert torch.equal(matrix, expected_maps[i][j]), (i, j)
            assert not torch.equal(matrix, maps[i][j])  # the step did move it
        assert SENT not in state.extras


class DtypesSeen(TorchDispatchMode):
    """The dtypes of every floating-point tensor each op that runs under it takes or
    returns."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in pytree.tree_leaves((args, kwargs, out)):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                self.dtypes.add(value.dtype)
        return out


def test_under_bf16_mixed_the_map_maths_is_float32_and_fp32s_bit_for_bit():
    """runtime.precision bf16-mixed runs a client's steps under bfloat16 autocast (as the host
    does); Sheaf-FMTL's map maths stays out of it: every op of the projections, θ-step and map
    step sees float32 only, the values sent are float32 (32 bits an entry: README,
    runtime.precision) and the round equals the spec computed in float32, bit for bit."""
    lr, lam, eta = 0.5, 0.3, 0.2
    algorithm = sheaf(lr=lr, lam=lam, map_lr=eta, gamma=0.5, init_std=0.3)
    states, ctxs, thetas, maps = path_of_three(algorithm, seed=5)
    expected_thetas, expected_maps, expected_sent = spec_round(lr, lam, eta, thetas, maps)

    with precision("bf16-mixed", "cpu"):
        assert (maps[0][1] @ thetas[0]).dtype == torch.bfloat16  # autocast is on
        with DtypesSeen() as seen:
            outboxes = {i: algorithm.projections(s, ctxs[i], thetas[i]) for i, s in states.items()}
            inboxes = deliver(outboxes)
            outboxes = {
                i: algorithm.theta_step(s, inboxes[i], ctxs[i])[1] for i, s in states.items()
            }
            inboxes = deliver(outboxes)
            for i, state in states.items():
                algorithm.map_step(state, inboxes[i], ctxs[i])
    assert seen.dtypes == {torch.float32}
    for i, outbox in outboxes.items():
        for message in outbox:
            sent = message.tensors["projection"]
            assert sent.dtype == torch.float32 and payload_bits(message.tensors) == 32 * 7
            assert torch.equal(sent, expected_sent[i][int(message.dst.split("/")[1])])
    for i, state in states.items():
        assert torch.equal(algorithm.flat_theta(state.model), expected_thetas[i])
        for j, matrix in state.extras["maps"].items():
            assert torch.equal(matrix, expected_maps[i][j]), (i, j)


def test_identity_maps_on_unequal_clients_are_refused_before_the_run():
    """P_ij = I needs γ = 1 and equal d_i: a one-line refusal before any round, where round
    1's step used to raise it."""
    sheaf = get_algorithm("sheaf_fmtl")
    one_model = FederationInfo(2, (4, 4), (10, 10), (1, 8, 8), models=("mlp", "mlp"))
    sheaf(sheaf.Params(map_init="identity", gamma=1.0), None).check_resources(one_model, 1e9)
    two_heads = FederationInfo(2, (4, 4), (10, 4), (1, 8, 8), models=("mlp", "mlp"))
    for params, federation in [({"gamma": 0.5}, one_model), ({"gamma": 1.0}, two_heads)]:
        algorithm = sheaf(sheaf.Params(map_init="identity", **params), None)
        with pytest.raises(ValueError, match="^algorithm.params.map_init: identity needs gamma"):
            algorithm.check_resources(federation, 1e9)


def test_oracle_clustering_with_fewer_lps_than_tasks_is_refused_before_the_run():
    oneshot = get_algorithm("oneshot_hfl")
    algorithm = oneshot(oneshot.Params(clustering="oracle"), None)
    federation = FederationInfo(3, (4, 4, 4), (10,) * 3, (1, 8, 8), num_lps=2, tasks=(0, 1, 2))
    with pytest.raises(ValueError, match="^topology.num_lps: 2 LPSs for 3 tasks; oracle"):
        algorithm.check_resources(federation, 1e9)
    enough = FederationInfo(3, (4, 4, 4), (10,) * 3, (1, 8, 8), num_lps=3, tasks=(0, 1, 2))
    algorithm.check_resources(enough, 1e9)
