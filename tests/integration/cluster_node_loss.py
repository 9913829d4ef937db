"""A worker node of a 3-node `ray.cluster_utils.Cluster` is removed mid-run; the federation
is rolled back and replayed on the nodes left, and the results equal the fault-free run's.

Run by tests/integration/test_faults.py in its own process (one Ray per process):
    python -m tests.integration.cluster_node_loss OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import ray
from ray.cluster_utils import Cluster

from raymtl.config import parse_config
from raymtl.runtime import run_experiment
from tests.conftest import digits_experiment

COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]


def main(out: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    doomed = cluster.add_node(num_cpus=2)
    cluster.add_node(num_cpus=2)  # the spare: head + spare still fit the three client actors
    ray.init(address=cluster.address, log_to_driver=False)
    settings = {"runtime.executor": "ray", "runtime.clients_per_actor": 2, "rounds": 4,
                "checkpoint_every": 2, "runtime.max_restarts": 2}  # fmt: skip
    cfg = parse_config(digits_experiment(out, **settings))
    whole = run_experiment(cfg, out / "whole")
    removed = []

    def remove_node(seed, round_index, row):
        if round_index == 3 and not removed:
            cluster.remove_node(doomed)
            removed.append(doomed.node_id)

    recovered = run_experiment(cfg, out / "faulty", remove_node)
    faults = pd.read_parquet(recovered / "faults.parquet")
    assert removed and set(faults["node"]) == {removed[0]}, faults
    frames = [pd.read_parquet(run / "clients.parquet").sort_values(COLUMNS[:3])[COLUMNS]
              for run in (whole, recovered)]  # fmt: skip
    pd.testing.assert_frame_equal(*(f.reset_index(drop=True) for f in frames))
    print(f"identical after losing node {removed[0]}: {len(faults)} host(s) lost")
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
