"""Whole runs of clients with tasks: a new kind of task with FedAvg, different tasks with
the backbone-sharing algorithms."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_tasks import config


def test_one_task_of_a_new_kind_runs_with_fedavg(tmp_path):
    from raymtl.runtime import run_experiment

    tasks = [{"name": "landmarks", "targets": "landmarks"}]
    cfg = config(tmp_path, **{"data.tasks": tasks, "algorithm.name": "fedavg", "rounds": 1})
    import pandas as pd

    clients = pd.read_parquet(run_experiment(cfg) / "clients.parquet")
    assert set(clients["task_name"]) == {"landmarks"} and np.isfinite(clients["mse"]).all()


@pytest.mark.parametrize("algorithm", ["hfedavg", "oneshot_hfl", "intra_group"])
def test_backbone_sharing_algorithms_run_different_tasks(tmp_path, algorithm):
    import pandas as pd

    from raymtl.runtime import run_experiment

    settings = {
        "algorithm.name": algorithm,
        "rounds": 2,
        "data.partition": {"kind": "iid", "max_samples_per_client": 40},
    }
    if algorithm != "intra_group":
        settings.update({"topology.kind": "hierarchical", "topology.num_lps": 2})
    clients = pd.read_parquet(run_experiment(config(tmp_path, **settings)) / "clients.parquet")
    last = clients[clients["round"] == 2]
    assert np.isfinite(last[last["task_name"] == "attributes"]["f1"]).all()
    assert np.isfinite(last[last["task_name"] == "landmarks"]["mse"]).all()
