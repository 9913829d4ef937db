"""What does `raymtl compare --parallel` gain over the sequential comparison on a cluster?

A comparison of 4 arms (fedavg, local, fedprox, ditto) x 3 seeds on digits, on a 3-node
`ray.cluster_utils.Cluster` (a head and two workers in this machine, `--cpus-per-node`
CPUs each), run twice on the same cluster:

(a) sequential: the 12 seeds one after another on this process; `clients_per_actor: auto`
    fills the whole cluster with one seed's client actors;
(b) `parallel="auto"`: every (arm, seed) a Ray Tune trial in a placement group of its own,
    as many at once as the cluster holds (auto clients per actor: the trial's share).

Both give the same table (checked: every figure but the timings). Recorded: the total
time, the trials in flight at most (seeds whose rounds overlap in time), the seconds spent
inside rounds (summed over seeds: what concurrency on few cores slows down), and the time
to the first round (sequential: each seed's set-up after the previous one; parallel: the
first wave of trials from the start, placement groups, trial processes and actors
included): the scheduling overhead. The median over --repeats is printed last, with the
speed-up (sequential / parallel total time).

    .venv/bin/python benchmarks/parallel_compare.py [--cpus-per-node 1] [--rounds 3]
        [--repeats 1] [--out /tmp/parallel_compare]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd

import raymtl
from raymtl.api.callbacks import Callback

ARMS = "algorithm.name=fedavg,local,fedprox,ditto"
TIMING = ("wall_time", "client_updates_per_second", "peak_memory")


def experiment(args, out: Path) -> dict:
    return {
        "name": "bench",
        "data": {
            "name": "digits",
            "num_clients": args.clients,
            "partition": {
                "kind": "classes_per_client",
                "classes_per_client": 2,
                "rotations": [0, 90, 180],
                "max_samples_per_client": 60,
            },
        },
        "model": {"name": "cnn_mnist"},
        "algorithm": {"name": "fedavg", "params": {"epochs": 1, "lr": 0.05}},
        "rounds": args.rounds,
        "checkpoint_every": args.rounds,
        "seeds": [0, 1, 2],
        "runtime": {"executor": "ray", "clients_per_actor": "auto", "dashboard": False},
        "output": {"dir": str(out), "plots": False},
    }


class RoundClock(Callback):
    """When each (arm, seed) reported each round (seconds since `began`), and the seed's
    seconds inside rounds so far (rounds.parquet's wall_time: cumulative)."""

    def __init__(self, began: float, log: list):
        self.began, self.log, self.name = began, log, ""

    def on_run_start(self, config, run_dir) -> None:
        self.name = config.name

    def on_round_end(self, event) -> None:
        at = time.perf_counter() - self.began
        self.log.append((self.name, event.seed, event.round, at, event.row["wall_time"]))


def spans(log: list) -> dict:
    """(arm, seed) -> (start of its first round, end of its last round, seconds in rounds)."""
    frame = pd.DataFrame(log, columns=["arm", "seed", "round", "at", "seconds"])
    out = {}
    for key, rows in frame.groupby(["arm", "seed"]):
        first = rows.sort_values("round").iloc[0]
        out[key] = (first["at"] - first["seconds"], rows["at"].max(), rows["seconds"].max())
    return out


def in_flight(by_trial: dict) -> int:
    """The most seeds whose rounds overlap in time."""
    starts = [(span[0], 1) for span in by_trial.values()]
    events = sorted(starts + [(span[1], -1) for span in by_trial.values()])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def measure(args, out: Path, parallel) -> dict:
    log: list = []
    began = time.perf_counter()
    comparison = raymtl.compare(
        [experiment(args, out)],
        [ARMS],
        out=out / f"compare-{parallel}",
        callbacks=[RoundClock(began, log)],
        parallel=parallel,
    )
    total = time.perf_counter() - began
    by_trial = spans(log)
    starts = sorted(start for start, _, _ in by_trial.values())
    if parallel == 1:  # each seed's set-up: from the previous seed's last round
        ends = sorted(end for _, end, _ in by_trial.values())
        setup = [starts[0]] + [s - e for s, e in zip(starts[1:], ends[:-1], strict=True)]
    else:  # the first wave: as many trials as ran at once at the most
        setup = starts[: in_flight(by_trial)]
    return {
        "total_s": total,
        "in_flight_max": in_flight(by_trial),
        "round_seconds": float(sum(seconds for _, _, seconds in by_trial.values())),
        "first_round_s": statistics.median(setup),
        "table": comparison.table,
    }


def learned(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=[c for c in table.columns if c.startswith(TIMING)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus-per-node", type=float, default=1)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/parallel_compare"))
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False},
    )
    for _ in range(2):
        cluster.add_node(num_cpus=args.cpus_per_node)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    rows = []
    try:
        for repeat in range(args.repeats):
            out = args.out / f"repeat{repeat}"
            sequential = measure(args, out, 1)
            parallel = measure(args, out, "auto")
            same = learned(sequential["table"]).equals(learned(parallel["table"]))
            for mode, result in (("sequential", sequential), ("parallel auto", parallel)):
                row = {k: v for k, v in result.items() if k != "table"}
                rows.append({"repeat": repeat, "mode": mode, **row, "same_table": same})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    frame = pd.DataFrame(rows)
    medians = frame.groupby("mode").median(numeric_only=True)
    print(medians.to_string())
    speedup = medians.loc["sequential", "total_s"] / medians.loc["parallel auto", "total_s"]
    print(f"speed-up (median total): {speedup:.2f}x; same table: {bool(frame.same_table.all())}")


if __name__ == "__main__":
    main()
