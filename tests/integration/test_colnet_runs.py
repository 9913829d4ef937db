"""ColNet end to end on one shared local Ray: outputs, rotating leaders, heads that stay home,
a lost leader, and parity with the in-process executor."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from raymtl.config import parse_config
from raymtl.data.sources import DEBIAN_FASHION_MNIST_DIR
from raymtl.models import build_model
from raymtl.runtime import run_experiment
from tests.conftest import digits_experiment, kill_host_after_round

TWIN_TASKS = [
    {
        "name": "attributes",
        "targets": "attributes",
        "clients": 3,
        "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 5e-3},
    },
    {
        "name": "landmarks",
        "targets": "landmarks",
        "clients": 3,
        "optimizer": {"name": "adam", "lr": 1e-3},
    },
]


def twin(tmp_path, source="digits", **overrides):
    """Six clients, two task groups of three (attributes | landmarks), ColNet, 3 rounds."""
    settings = {
        "data.name": source,
        "data.partition": {"kind": "iid", "max_samples_per_client": 60},
        "data.tasks": TWIN_TASKS,
        "algorithm.name": "colnet",
        "algorithm.params": {"epochs": 1},
        "rounds": 3,
        "runtime.executor": "ray",
        **overrides,
    }
    return parse_config(digits_experiment(tmp_path, **settings))


def backbone_bits(cfg, input_shape) -> int:
    model = build_model(cfg.model.name, input_shape, 10)
    return sum(t.numel() * 32 for n, t in model.state_dict().items() if n.startswith("backbone."))


@pytest.mark.slow
@pytest.mark.skipif(not Path(DEBIAN_FASHION_MNIST_DIR).is_dir(), reason="no Fashion-MNIST")
def test_colnet_on_the_fashion_mnist_twin_writes_every_output(ray_session, tmp_path):
    cfg = twin(tmp_path, "fashion_mnist", **{"output.plots": True})
    run_dir = run_experiment(cfg, tmp_path / "run")
    for name in ("clients.parquet", "rounds.parquet", "messages.parquet", "leaders.parquet"):
        assert (run_dir / name).is_file(), name
    for plot in ("tasks.png", "leaders.png", "accuracy_vs_round.png"):
        assert (run_dir / "plots" / plot).is_file(), plot
    clients = pd.read_parquet(run_dir / "clients.parquet")
    attributes = clients[clients["task_name"] == "attributes"]
    landmarks = clients[clients["task_name"] == "landmarks"]
    assert attributes["f1"].between(0, 1).all() and attributes["mse"].isna().all()
    assert (landmarks["mse"] >= 0).all() and landmarks["f1"].isna().all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"]["attributes"]["metric"] == "f1"
    assert summary["tasks"]["landmarks"]["metric"] == "mse"
    assert summary["leaders"]["aggregate_seconds"] > 0


def test_leadership_rotates_and_heads_never_travel(ray_session, tmp_path):
    cfg = twin(tmp_path)
    run_dir = run_experiment(cfg, tmp_path / "run")
    leaders = pd.read_parquet(run_dir / "leaders.parquet").sort_values(["group", "round"])
    assert sorted(leaders["round"].unique()) == [1, 2]  # the last round trains only
    for group, rows in leaders.groupby("group"):
        members = {0: {0, 1, 2}, 1: {3, 4, 5}}[group]
        assert set(rows["leader"]) <= members
        assert list(rows["leader"])[1:] == list(rows["next_leader"])[:-1]  # as announced
        assert rows["leader"].nunique() == 2  # it rotates: a different member each round
    messages = pd.read_parquet(run_dir / "messages.parquet")
    between_clients = messages[
        (messages["src_role"] == "client") & (messages["dst_role"] == "client")
    ]
    assert set(between_clients["kind"]) == {"backbone"}
    assert (between_clients["bits"] == backbone_bits(cfg, (1, 8, 8))).all()  # no head inside
    to_members = messages[messages["kind"] == "backbone_update"]
    assert (to_members["bits"] == backbone_bits(cfg, (1, 8, 8)) + 64).all()  # + next leader id
    # The leader's traffic is its holder's; the holder's hand-off to its own role is free.
    deltas = messages[messages["kind"] == "delta"].merge(leaders, on=["seed", "round"])
    deltas = deltas[deltas["src"] == "leader/" + deltas["group"].astype(str)]
    assert (deltas["src_client"] == deltas["leader"]).all()
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    handoffs = messages["src_client"] == messages["dst_client"]  # holder <-> its own role
    assert set(messages[handoffs]["kind"]) == {"group_backbone", "round_start", "backbone_update"}
    per_round = messages[~handoffs].groupby("round")["bits"].sum()
    assert list(rounds["bits_up"] + rounds["bits_down"])[:2] == list(per_round)


@pytest.mark.cluster
def test_the_group_goes_on_when_its_leader_actor_dies(ray_session, tmp_path):
    """max_restarts 0: the lost leader host is replaced and the next member leads."""
    killed = []
    kill_leader_after_round_one = kill_host_after_round(ray_session, "leader-0", 1, False, killed)
    cfg = twin(tmp_path, **{"runtime.max_restarts": 0, "rounds": 4})
    run_dir = run_experiment(cfg, tmp_path / "run", progress=kill_leader_after_round_one)
    assert killed
    leaders = pd.read_parquet(run_dir / "leaders.parquet")
    first, second = (leaders[(leaders["group"] == 0) & (leaders["round"] == r)] for r in (1, 2))
    announced = int(first["next_leader"].iloc[0])
    assert bool(second["failover"].iloc[0]) and not leaders["failover"].iloc[:2].any()
    assert int(second["leader"].iloc[0]) == [0, 1, 2][([0, 1, 2].index(announced) + 1) % 3]
    assert sorted(leaders["round"].unique()) == [1, 2, 3]  # every round aggregated
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert clients[clients["round"] == 4]["loss"].notna().all()


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["colnet", "fedper_ic"])
def test_inline_and_ray_executors_agree_exactly(ray_session, tmp_path, algorithm):
    runs = {
        executor: run_experiment(
            twin(tmp_path, **{"runtime.executor": executor, "algorithm.name": algorithm}),
            tmp_path / executor,
        )
        for executor in ("inline", "ray")
    }
    columns = ["round", "client", "loss", "f1", "mse", "bits_up", "bits_down"]
    inline, remote = (pd.read_parquet(r / "clients.parquet")[columns] for r in runs.values())
    pd.testing.assert_frame_equal(inline, remote)
    leaders = [
        pd.read_parquet(r / "leaders.parquet")[["round", "group", "leader"]] for r in runs.values()
    ]
    pd.testing.assert_frame_equal(*leaders)


@pytest.mark.slow
def test_the_cifar10_job_runs_on_a_tiny_cifar10_in_torchvisions_format(tmp_path):
    """jobs/colnet_cifar10.yaml's loading path, on files the test writes itself."""
    import numpy as np

    from raymtl.config import load_config
    from tests.unit.test_sources import write_pickle

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        images = rng.integers(0, 256, (20, 3072), dtype=np.uint8)
        write_pickle(folder / name, {"data": images, "labels": [i % 10 for i in range(20)]})
    write_pickle(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    overrides = [
        *(f"data.root={tmp_path}", "rounds=2", "seeds=[0]", "runtime.executor=inline"),
        *(f"output.dir={tmp_path}", "output.plots=false", "algorithm.params.epochs=1"),
    ]
    cfg = load_config(Path(__file__).parents[2] / "jobs" / "colnet_cifar10.yaml", overrides)
    run_dir = run_experiment(cfg)
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert set(clients["task_name"]) == {"animals", "objects"}
    assert list(clients[clients["round"] == 2]["task"]) == [0, 1, 0, 1, 0, 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"]["animals"]["metric"] == "accuracy"
    messages = pd.read_parquet(run_dir / "messages.parquet")
    # BL-1: layer4 stays home, so a backbone message is far smaller than the whole ResNet-18.
    backbone = messages[messages["kind"] == "backbone"]["bits"].iloc[0]
    assert backbone < 0.3 * 11.2e6 * 32


def test_a_resumed_colnet_run_equals_the_uninterrupted_one(tmp_path):
    from raymtl.runtime import resume_experiment

    settings = {"runtime.executor": "inline", "rounds": 4, "checkpoint_every": 2}
    whole = run_experiment(twin(tmp_path, **settings), tmp_path / "whole")
    cut = run_experiment(twin(tmp_path, **settings), tmp_path / "cut", stop_after=3)
    resumed = resume_experiment(cut)
    columns = ["round", "client", "loss", "f1", "mse", "bits_up", "bits_down"]
    frames = [pd.read_parquet(r / "clients.parquet")[columns] for r in (whole, resumed)]
    pd.testing.assert_frame_equal(*frames)
    leaders = [
        pd.read_parquet(r / "leaders.parquet")[["round", "group", "leader"]]
        for r in (whole, resumed)
    ]
    pd.testing.assert_frame_equal(*leaders)
