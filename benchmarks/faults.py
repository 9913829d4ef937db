"""What the recoveries of a faulty run cost: a fifth of the client actors killed at random
rounds (runtime.inject_faults) against the same run without faults.

FedAvg on rotated digits: 10 clients, one a client actor (0.2 CPU each, so all ten fit a
2-CPU machine), 10 rounds, a checkpoint every 2. The faulty run kills 2 of the 10 client
actors (`{kill: clients, share: 0.2, seed: 7}`), each at the start of a round drawn from the
seed; runtime.max_restarts is the number of distinct rounds hit. Each kill rolls the whole
federation back to its last complete checkpoint and replays, so clients.parquet must equal
the fault-free run's (checked on every repeat). Reported per repeat, then the median:

  wall_s          the run's wall time (run_experiment: Ray already started, actors not)
  lost_s          faults.parquet's seconds_lost: from the hosts' start to the fault
  replayed        rounds run twice (round - rolled_back_to - 1, summed)
  extra_s         the faulty run's wall time minus the fault-free run's of the same repeat

    .venv/bin/python benchmarks/faults.py                # 3 repeats
    .venv/bin/python benchmarks/faults.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from raymtl.config import parse_config
from raymtl.runtime import run_experiment
from raymtl.runtime.faults import injection_schedule

CLIENTS, ROUNDS, EVERY = 10, 10, 2
FAULT = {"kill": "clients", "share": 0.2, "seed": 7}
COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]


def experiment(out: Path, faulty: bool) -> dict:
    runtime = {
        "executor": "ray",
        "dashboard": False,
        "clients_per_actor": 1,
        "num_cpus_per_actor": 0.2,
        # Starting 11 actor processes on a loaded 2-core machine took over a minute once.
        "placement_timeout_s": 300,
    }
    if faulty:
        hosts = [f"clients-{k}" for k in range(CLIENTS)] + ["server"]
        cfg = parse_config({"runtime": {**runtime, "inject_faults": [FAULT]}})
        schedule = injection_schedule(cfg.runtime.inject_faults, hosts, ROUNDS)
        runtime |= {"inject_faults": [FAULT], "max_restarts": len(schedule)}
    return {
        "name": "faulty" if faulty else "whole",
        "data": {
            "name": "digits",
            "num_clients": CLIENTS,
            "partition": {
                "kind": "classes_per_client",
                "classes_per_client": 2,
                "rotations": [0, 90, 180],
                "max_samples_per_client": 120,
            },
        },
        "model": {"name": "cnn_mnist"},
        "algorithm": {"name": "fedavg", "params": {"epochs": 1, "lr": 0.1}},
        "rounds": ROUNDS,
        "checkpoint_every": EVERY,
        "seeds": [0],
        "runtime": runtime,
        "output": {"dir": str(out), "plots": False},
    }


def clients(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "clients.parquet").sort_values(COLUMNS[:3])
    return frame[COLUMNS].reset_index(drop=True)


def timed_run(out: Path, faulty: bool) -> tuple[float, Path]:
    began = time.perf_counter()
    run_dir = Path(run_experiment(parse_config(experiment(out, faulty)), out / str(faulty)))
    return time.perf_counter() - began, run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder)
            whole_s, whole = timed_run(out, faulty=False)
            faulty_s, faulty = timed_run(out, faulty=True)
            faults = pd.read_parquet(faulty / "faults.parquet")
            equal = clients(whole).equals(clients(faulty))
            rows.append(
                {
                    "repeat": repeat,
                    "whole_s": whole_s,
                    "faulty_s": faulty_s,
                    "extra_s": faulty_s - whole_s,
                    "kills": int(faults["injected"].sum()),
                    "recoveries": int(faults["action"].str.startswith("rolled back").sum()),
                    "replayed": int((faults["round"] - faults["rolled_back_to"] - 1).sum()),
                    "lost_s": float(faults["seconds_lost"].sum()),
                    "fault_rounds": ",".join(str(r) for r in sorted(faults["round"])),
                    "identical": equal,
                    "final_accuracy": float(
                        pd.read_parquet(faulty / "rounds.parquet")["mean_accuracy"].iloc[-1]
                    ),
                }
            )
            print(rows[-1], flush=True)
    ray.shutdown()
    frame = pd.DataFrame(rows)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    medians = {c: statistics.median(frame[c]) for c in ("whole_s", "faulty_s", "extra_s", "lost_s")}
    print("median:", {k: round(v, 1) for k, v in medians.items()})
    assert frame["identical"].all(), (
        "a faulty run's clients.parquet differs from the fault-free one"
    )


if __name__ == "__main__":
    main()
