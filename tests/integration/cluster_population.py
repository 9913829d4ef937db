"""A population shared by a cluster's nodes: on a 2-node `ray.cluster_utils.Cluster`, 2,000
clients of LEAF's Synthetic (made on the host that holds each client) in 4 client hosts of
500, a cohort of 20 a round. Prints one JSON line (`POPULATION {...}`) that
tests/integration/test_population.py reads: each host's node, and whether the results equal
the same run inline. Run in its own process (one Ray per process):
    python -m tests.integration.cluster_population OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import ray
from ray.cluster_utils import Cluster

from raymtl.config import parse_config
from raymtl.runtime import run_experiment
from tests.conftest import digits_experiment

CLIENTS, PER_HOST = 2000, 500
COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]


def experiment(out: Path, executor: str) -> dict:
    raw = digits_experiment(out, rounds=2, eval_every=2, checkpoint_every=2)
    raw["data"] = {
        "name": "leaf_synthetic",
        "num_clients": CLIENTS,
        "params": {"alpha": 0.5, "beta": 0.5, "max_samples": 12},
    }
    raw["model"] = {"name": "mlp"}
    raw["algorithm"]["params"]["sample_fraction"] = 20 / CLIENTS
    raw["eval_fraction"] = 0.05
    raw["runtime"] = {
        "executor": executor,
        "dashboard": False,
        "clients_per_actor": PER_HOST,
        "num_cpus_per_actor": 1,
    }
    return raw


def clients(run: Path) -> pd.DataFrame:
    frame = pd.read_parquet(run / "clients.parquet").sort_values(COLUMNS[:3])
    return frame[COLUMNS].reset_index(drop=True)


def main(out: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    worker = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    inline = run_experiment(parse_config(experiment(out, "inline")), out / "inline")
    shared = run_experiment(parse_config(experiment(out, "ray")), out / "ray")
    hosts = pd.read_parquet(shared / "hosts.parquet")
    hosts = hosts[hosts["host"].str.startswith("clients-")].drop_duplicates("host")
    print(
        "POPULATION "
        + json.dumps(
            {
                "head": ray.get_runtime_context().get_node_id(),
                "worker": worker.node_id,
                "nodes": dict(zip(hosts["host"], hosts["node"], strict=True)),
                "equal": clients(inline).equals(clients(shared)),
            }
        ),
        flush=True,
    )
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
