"""Worker nodes of a `ray.cluster_utils.Cluster` crash mid-run (killed, not shut down: Ray
only notices by its health checks), one scenario after another on one head:

  one_recovery   the head holds every actor of the layout: one recovery, results equal
  replanned      the 4 client actors no longer fit the head: re-planned onto 2 actors of 2
                 clients, one recovery, results equal
  cannot_fit     a client actor of 2.5 CPUs fits no node left: the run stops in one line
                 within runtime.placement_timeout_s

Each prints one JSON line (`SCENARIO {...}`) that tests/integration/test_faults.py reads.
Run in its own process (one Ray per process):
    python -m tests.integration.cluster_node_loss OUT_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd
import ray
from ray.cluster_utils import Cluster

from raymtl.config import parse_config
from raymtl.runtime import run_experiment
from raymtl.runtime.faults import RunStopped
from tests.conftest import digits_experiment

COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]
SETTINGS = {"data.num_clients": 4, "rounds": 4, "checkpoint_every": 2, "runtime.max_restarts": 1}
# A crashed node is declared dead after ~2 s instead of Ray's default ~30 s.
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


def clients(run: Path) -> pd.DataFrame:
    frame = pd.read_parquet(run / "clients.parquet").sort_values(COLUMNS[:3])
    return frame[COLUMNS].reset_index(drop=True)


def same_results(run: pd.DataFrame, reference: pd.DataFrame) -> bool:
    """Every figure bitwise equal, the loss included: a client's evaluation does not depend
    on which other clients its host holds (tasks/objectives.py), so a re-planned layout
    gives the numbers the planned one gives."""
    return run.equals(reference)


def crash_worker(cluster: Cluster, out: Path, name: str, worker_cpus: float, **settings) -> dict:
    """Run with a worker of `worker_cpus` CPUs that crashes once round 3 is done; what
    happened, as a mapping."""
    worker = cluster.add_node(num_cpus=worker_cpus)
    cluster.wait_for_nodes()
    cfg = parse_config(
        digits_experiment(out, **{"runtime.executor": "ray", **SETTINGS, **settings})
    )
    crashed = []

    def crash(seed, round_index, row):
        if round_index == 3 and not crashed:
            cluster.remove_node(worker, allow_graceful=False)
            crashed.append(time.monotonic())

    began = time.monotonic()
    result = {"name": name, "node": worker.node_id, "stopped": None}
    run = out / name
    try:
        run_experiment(cfg, run, crash)
    except RunStopped as error:
        result["stopped"] = str(error)
        result["seconds_to_stop"] = time.monotonic() - crashed[0] if crashed else None
    faults = pd.read_parquet(run / "faults.parquet")
    result["faults"] = faults[["round", "host", "node", "recovery", "action"]].to_dict("records")
    if result["stopped"] is None:
        result["equal"] = same_results(clients(run), clients(out / "reference"))
    result["seconds"] = time.monotonic() - began
    return result


def main(out: Path) -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "_system_config": HEALTH_CHECKS},
    )
    ray.init(address=cluster.address, log_to_driver=False)
    # The fault-free run, inline: the Ray executor gives the same results in any layout
    # (test_ray_runs.py: inline and Ray agree exactly).
    reference = parse_config(digits_experiment(out, **SETTINGS))
    run_experiment(reference, out / "reference")
    too_big = {
        "runtime.clients_per_actor": 4,
        "runtime.num_cpus_per_actor": 2.5,
        "runtime.placement_timeout_s": 10,
    }
    scenarios = [
        crash_worker(cluster, out, "one_recovery", 1, **{"runtime.clients_per_actor": 2}),
        crash_worker(cluster, out, "replanned", 2, **{"runtime.clients_per_actor": 1}),
        crash_worker(cluster, out, "cannot_fit", 3, **too_big),
    ]
    for scenario in scenarios:
        print("SCENARIO " + json.dumps(scenario), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
