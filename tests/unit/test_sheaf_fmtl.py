"""Sheaf-FMTL's maths on hand-made tensors, its equivalence to dFedU, and its memory check."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.algorithms.registry import get_algorithm
from raymtl.algorithms.sheaf_fmtl import interaction_dim
from raymtl.config import ConfigError, parse_config
from raymtl.models import build_model
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


def context(me):
    return StepContext(me, 2, 5, 0, (0, 1, 2), PATH)


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
        ("client/0", [4.0]), ("client/2", [2.0]),
    ]  # the new P_1j θ_1  # fmt: skip


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
    from raymtl.runtime.planning import check_federation

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


def test_with_identity_maps_a_round_is_a_dfedu_round(tmp_path):
    from raymtl.runtime import run_experiment

    common = {"rounds": 1, "topology.kind": "erdos_renyi", "topology.params": {"p": 0.5},
              "model.name": "logreg"}  # fmt: skip
    sheaf_params = {"lr": 0.1, "lam": 0.5, "gamma": 1.0, "map_init": "identity",
                    "map_lr": 0.0, "l2": 0.0}  # fmt: skip
    dfedu_params = {"lr": 0.1, "lam": 0.5, "epochs": 1, "similarity": "ones"}
    runs = {
        name: run_experiment(parse_config(digits_experiment(
            tmp_path, **common, **{"algorithm.name": name, "algorithm.params": params})),
            tmp_path / name)
        for name, params in (("sheaf_fmtl", sheaf_params), ("dfedu", dfedu_params))
    }  # fmt: skip
    sheaf_rows, dfedu_rows = (pd.read_parquet(d / "clients.parquet") for d in runs.values())
    pd.testing.assert_series_equal(sheaf_rows["loss"], dfedu_rows["loss"], rtol=1e-5, atol=1e-7)
    assert (sheaf_rows["accuracy"] == dfedu_rows["accuracy"]).all()


def test_identity_maps_need_gamma_one():
    algorithm = sheaf(map_init="identity", gamma=0.5)
    state = State(model=tiny_model((0.0, 0.0)))
    inbox = [Message("client/0", "client/1", "dim", {"dim": torch.tensor([2])})]
    with pytest.raises(ValueError, match="identity needs"):
        algorithm.init_maps(state, inbox, context("client/1"))


def test_a_cluster_run_is_held_to_what_ray_reports(tmp_path, capsys):
    from raymtl.runtime.planning import check_federation, check_memory

    settings = {"algorithm.name": "sheaf_fmtl", "runtime.address": "auto"}
    cfg = parse_config(digits_experiment(tmp_path, **settings))
    check_federation(cfg)  # before connecting: printed, not refused
    assert "budget no limit" in capsys.readouterr().out
    from raymtl.runtime.executor import InlineExecutor
    from raymtl.runtime.planning import build_federation, partition

    pools, shards, specs, _ = partition(cfg, 0)
    federation = build_federation(
        cfg, 0, InlineExecutor(cfg.runtime), pools["digits"], shards, specs
    )
    with pytest.raises(ConfigError, match="runtime.memory_budget: sheaf_fmtl needs"):
        check_memory(cfg, federation, reported=1000)  # what a (tiny) cluster reported
