"""Client state that costs only what the algorithm keeps (in process: no Ray needed).

FedAvg keeps nothing per client: 2,000 clients leave no model and no tensor on their host,
and a round's bits are 2 × sampled × parameters × 32. FedU keeps each client's model: under
a small runtime.memory_budget most of them live on disk, and the run (checkpoints and
resume included) gives exactly the results of one that keeps them all in memory.
"""

from __future__ import annotations

import pandas as pd
import pytest

from raymtl.config import parse_config
from raymtl.models import build_model
from raymtl.runtime import resume_experiment, run_experiment
from tests.conftest import digits_experiment

MANY = {
    "data.name": "synthetic",
    "data.params": {"num_samples": 20000, "shape": [1, 8, 8]},
    "data.partition": {"kind": "iid"},
    "model.name": "mlp",
    "algorithm.params": {"epochs": 1, "lr": 0.1, "sample_fraction": 0.01},
    "checkpoint_every": 1,
}


def float_params(name: str) -> int:
    model = build_model(name, (1, 8, 8), 10)
    return sum(v.numel() for v in model.state_dict().values() if v.is_floating_point())


@pytest.mark.parametrize("clients", [200, 2000])
def test_fedavg_hosts_keep_no_model_per_client_whatever_n(tmp_path, clients):
    cfg = parse_config(digits_experiment(tmp_path, **MANY, **{"data.num_clients": clients}))
    run_dir = run_experiment(cfg, tmp_path / "run")
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    # One working model serves every client; nothing of any client is kept between rounds.
    assert rounds["working_models"].tolist() == [1, 1]
    assert rounds["state_resident_bytes"].tolist() == [0, 0]
    assert rounds["clients_resident"].tolist() == [0, 0]
    assert rounds["clients_spilled"].tolist() == [0, 0]
    sampled = -(-clients // 100)
    assert (rounds["bits_up"] + rounds["bits_down"]).tolist() == [
        2 * sampled * float_params("mlp") * 32
    ] * 2
    clients_rows = pd.read_parquet(run_dir / "clients.parquet")
    assert len(clients_rows) == 2 * clients  # every client evaluated, with the global model
    # The checkpoint holds the server and the index of the clients saved: none.
    round1 = run_dir / "checkpoints" / "seed0" / "round00001"
    assert sorted(p.name for p in round1.iterdir()) == [
        "COMPLETE",
        "index-client_0.json",
        "server.pt",
    ]


def fedu_run(tmp_path, name: str, stop_after=None, **overrides):
    settings = {
        "algorithm.name": "fedu",
        "algorithm.params": {"epochs": 1, "lr": 0.05, "sample_fraction": 0.5},
        "data.num_clients": 8,
        "rounds": 3,
        **overrides,
    }
    cfg = parse_config(digits_experiment(tmp_path, **settings))
    return run_experiment(cfg, tmp_path / name, stop_after=stop_after)


def test_fedu_beyond_the_budget_spills_and_gives_the_same_results(tmp_path):
    model_bytes = float_params("cnn_mnist") * 4
    resident = fedu_run(tmp_path, "resident")
    budget = {"runtime.memory_budget": int(2.5 * model_bytes), "runtime.spill_dir": str(tmp_path)}
    spilled = fedu_run(tmp_path, "spilled", stop_after=2, **budget)
    spilled = resume_experiment(spilled)  # spilled state checkpointed, then read back
    rounds = pd.read_parquet(spilled / "rounds.parquet")
    assert (rounds["clients_spilled"] > 0).all()
    assert (rounds["state_resident_bytes"] <= 2.5 * model_bytes).all()
    pd.testing.assert_frame_equal(
        pd.read_parquet(resident / "clients.parquet").drop(columns=["wall_time"], errors="ignore"),
        pd.read_parquet(spilled / "clients.parquet").drop(columns=["wall_time"], errors="ignore"),
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("raymtl-spill-")]


@pytest.mark.parametrize("algorithm", ["fedavg", "local"])
def test_clients_trained_together_equal_clients_trained_one_after_the_other(tmp_path, algorithm):
    """runtime.batch_clients: the same per-client results, to float tolerance (mlp: no
    dropout, every client the same sample count so batches line up)."""
    settings = {
        "algorithm.name": algorithm,
        "model.name": "mlp",
        "data.partition": {"kind": "iid", "max_samples_per_client": 40},
        "algorithm.params": {"epochs": 2, "lr": 0.1, "momentum": 0.5, "batch_size": 8},
    }
    runs = {}
    for batch in (1, 3):
        cfg = parse_config(
            digits_experiment(tmp_path, **settings, **{"runtime.batch_clients": batch})
        )
        runs[batch] = pd.read_parquet(
            run_experiment(cfg, tmp_path / f"b{batch}") / "clients.parquet"
        )
    columns = ["round", "client", "loss", "accuracy"]
    pd.testing.assert_frame_equal(runs[1][columns], runs[3][columns], rtol=1e-4, atol=1e-5)
    assert runs[1]["loss"].nunique() > 1  # the clients differ: a real per-client comparison
