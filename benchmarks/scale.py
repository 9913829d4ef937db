"""How does a run grow with the number of clients N, at a fixed 100 sampled per round?

FedAvg (keeps nothing per client) at N = 100 / 1,000 / 10,000, and FedU (keeps each
client's model) at N = 100 / 1,000 / 2,000 under a runtime.memory_budget, on Fashion-MNIST
with the MNIST CNN, IID, 7 samples per client at every N (so the 100 sampled clients do the
same work whatever N: what grows is only what N costs), 3 rounds, every client evaluated once
at the end. Each configuration runs in a fresh process with its own local Ray; a thread
samples the proportional set size (PSS: shared pages split between their processes) of that
process and every process it started (Ray's GCS, raylet, object store, actors) every 0.25 s.

    .venv/bin/python benchmarks/scale.py                         # the table below, printed
    .venv/bin/python benchmarks/scale.py --record                # and into RESULTS.md
    .venv/bin/python benchmarks/scale.py --one fedavg 10000      # one configuration
    .venv/bin/python benchmarks/scale.py --cohort [--record]     # a cohort of 1,000 from
                                                                 # N = 10^4..10^6 (COHORT_RUNS)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
RUNS = {"fedavg": (100, 1000, 10000), "fedu": (100, 1000, 2000)}
SAMPLED, ROUNDS, SAMPLES_PER_CLIENT = 100, 3, 7
# `--cohort`: a cohort of 1,000 a round from N = 10,000 / 100,000 / 1,000,000 clients of
# LEAF's Synthetic (generated on the host that holds each client: the driver holds counts
# only), 12 samples each, an mlp, FedAvg; 1,000 clients evaluated at the last round
# (eval_fraction). Stateful: Ditto (a personal mlp per client) under a memory budget.
COHORT, COHORT_SAMPLES = 1000, 12
COHORT_RUNS = [
    ("fedavg", 10_000, "inline"),
    ("fedavg", 100_000, "inline"),
    ("fedavg", 1_000_000, "inline"),
    ("fedavg", 10_000, "ray"),
    ("fedavg", 1_000_000, "ray"),
    ("ditto", 10_000, "inline"),
    ("ditto", 100_000, "inline"),
    ("fedu", 10_000, "inline"),
    ("fedu", 100_000, "inline"),
    ("sfmtl_graph", 10_000, "inline"),
]
# Keep a personal model per client: run under runtime.memory_budget (--budget).
STATEFUL = ("ditto", "fedu", "sfmtl_graph")


def cohort_experiment(algorithm: str, clients: int, executor: str, run_dir: Path, args) -> dict:
    params = {"epochs": 1, "lr": 0.05, "sample_fraction": COHORT / clients}
    runtime = {"executor": executor, "dashboard": False}
    if algorithm in STATEFUL:
        runtime["memory_budget"] = args.budget
    return {
        "name": f"cohort-{algorithm}-{clients}-{executor}",
        "data": {
            "name": "leaf_synthetic",
            "num_clients": clients,
            "params": {"alpha": 0.5, "beta": 0.5, "max_samples": COHORT_SAMPLES},
        },
        "model": {"name": "mlp"},
        "algorithm": {"name": algorithm, "params": params},
        "rounds": ROUNDS,
        "eval_every": ROUNDS,
        "eval_fraction": min(1.0, COHORT / clients),
        "eval_all_at_end": False,
        "checkpoint_every": ROUNDS,
        "runtime": runtime,
        "output": {"dir": str(run_dir), "plots": False},
    }


def experiment(algorithm: str, clients: int, run_dir: Path, args) -> dict:
    params = {"epochs": 1, "lr": 0.05, "sample_fraction": SAMPLED / clients}
    runtime = {"executor": "ray", "dashboard": False, "precision": args.precision}
    if algorithm == "fedu":
        runtime["memory_budget"] = args.budget
    return {
        "name": f"scale-{algorithm}-{clients}",
        "data": {
            "name": "fashion_mnist",
            "num_clients": clients,
            "partition": {"kind": "iid", "max_samples_per_client": SAMPLES_PER_CLIENT},
        },
        "model": {"name": "cnn_mnist"},
        "algorithm": {"name": algorithm, "params": params},
        "rounds": ROUNDS,
        "eval_every": ROUNDS,
        "checkpoint_every": ROUNDS,
        "runtime": runtime,
        "output": {"dir": str(run_dir), "plots": False},
    }


def tree_pss(root: int) -> int:
    """PSS bytes of `root` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
            except OSError:
                continue
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class PeakMemory(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.done = 0, threading.Event()

    def run(self):
        while not self.done.wait(0.25):
            self.peak = max(self.peak, tree_pss(os.getpid()))


def run_one(algorithm: str, clients: int, args, executor: str | None = None) -> dict:
    """One configuration in this process; its figures (`executor`: the --cohort suite's)."""
    import pandas as pd

    import raymtl
    from raymtl.runtime import start_ray

    monitor = PeakMemory()
    monitor.start()
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        if executor is None:
            raw = experiment(algorithm, clients, run_dir, args)
        else:
            raw = cohort_experiment(algorithm, clients, executor, run_dir, args)
        cfg = raymtl.ExperimentConfig.model_validate(raw)
        ray_start = start_ray(cfg) if cfg.runtime.executor == "ray" else 0.0
        began = time.perf_counter()
        with raymtl.Federation(cfg, run_dir=run_dir) as federation:
            while not federation.done:
                federation.run_round()
        total = time.perf_counter() - began
        rounds = pd.read_parquet(run_dir / "rounds.parquet")
        phases = pd.read_parquet(run_dir / "phases.parquet")
    monitor.done.set()
    monitor.join()
    walls = rounds["wall_time"].tolist()
    per_round = [b - a for a, b in zip([0.0, *walls], walls, strict=False)]
    evaluate = float(rounds["seconds_evaluate"].fillna(0).sum())
    training_rounds = sum(per_round) - evaluate
    last = rounds.iloc[-1]
    return {
        "algorithm": algorithm,
        "clients": clients,
        "executor": cfg.runtime.executor,
        "ray_start_s": ray_start,
        "setup_s": total - walls[-1],
        "round_s": training_rounds / len(walls),
        "evaluate_s": evaluate,
        "peak_gib": monitor.peak / 2**30,
        "updates_per_s": float(rounds["clients_trained"].sum()) / training_rounds,
        "resident_mib": float(last["state_resident_bytes"]) / 2**20,
        "spilled_mib": float(last["state_spilled_bytes"]) / 2**20,
        "accuracy": float(last["mean_accuracy"]),
        "phase_s": {
            f"{role}.{step}": round(float(seconds) / len(walls), 2)
            for (role, step), seconds in phases.groupby(["role", "step"])["seconds"].sum().items()
        },
    }


def row(result: dict, args) -> str:
    budget = args.budget if result["algorithm"] == "fedu" else "-"
    return (
        f"| {date.today()} | {result['algorithm']} | {result['clients']:,} | {budget} | "
        f"{result['setup_s']:.1f} | {result['round_s']:.2f} | {result['evaluate_s']:.1f} | "
        f"{result['peak_gib']:.2f} | {result['updates_per_s']:.1f} | "
        f"{result['resident_mib']:.0f} / {result['spilled_mib']:.0f} | "
        f"{result['accuracy']:.3f} |"
    )


HEADER = (
    "| date | algorithm | N | memory_budget | set-up s | s per round (train) | evaluation s "
    "(all N, once) | peak PSS GiB (all processes) | client updates/s | kept state MiB "
    "resident / spilled | accuracy |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def cohort_row(result: dict, args) -> str:
    budget = args.budget if result["algorithm"] in STATEFUL else "-"
    per_client = result["peak_gib"] * 2**30 / result["clients"]
    return (
        f"| {date.today()} | {result['algorithm']} | {result['executor']} | "
        f"{result['clients']:,} | {budget} | {result['setup_s']:.1f} | {result['round_s']:.2f} "
        f"| {result['evaluate_s']:.1f} | {result['peak_gib']:.2f} | {per_client:,.0f} | "
        f"{result['resident_mib']:.0f} / {result['spilled_mib']:.0f} |"
    )


COHORT_HEADER = (
    "| date | algorithm | executor | N | memory_budget | set-up s (to the first round) | "
    "s per round | evaluation s (1,000 clients) | peak PSS GiB (all processes) | "
    "peak bytes per client | kept state MiB resident / spilled |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def run_cohort(args) -> None:
    """The --cohort suite, each configuration in a fresh process."""
    rows = []
    for algorithm, clients, executor in COHORT_RUNS:
        command = [sys.executable, __file__, "--one", algorithm, str(clients)]
        command += ["--executor", executor, "--budget", args.budget]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(cohort_row(json.loads(out.strip().splitlines()[-1]), args))
        print(rows[-1], flush=True)
    if args.record:
        flags = cpu_flags()
        machine = f"{platform.machine()}, {os.cpu_count()} cores, {flags}"
        section = "\n## Scale: a cohort of 1,000 from N clients (`benchmarks/scale.py --cohort`)\n"
        text = RESULTS.read_text()
        if section not in text:
            text += section + f"\nMachine: {machine}.\n\n{COHORT_HEADER}\n"
        RESULTS.write_text(text.rstrip("\n") + "\n" + "\n".join(rows) + "\n")


def cpu_flags() -> str:
    """The vector units of this CPU (AVX2, AVX-512, bf16) from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
                return " ".join(flag for flag in line.split() if flag in wanted)
    except OSError:
        pass
    return "flags unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=2, metavar=("ALGORITHM", "N"))
    parser.add_argument("--executor", choices=["inline", "ray"], help="--one of the cohort suite")
    parser.add_argument("--cohort", action="store_true", help="the cohort-of-1,000 suite")
    parser.add_argument("--budget", default="1GiB", help="FedU's and Ditto's runtime.memory_budget")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"])
    parser.add_argument("--record", action="store_true", help="append rows to RESULTS.md")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args, args.executor)))
        return
    if args.cohort:
        run_cohort(args)
        return
    rows = []
    for algorithm, sizes in RUNS.items():
        for clients in sizes:
            command = [
                sys.executable,
                __file__,
                "--one",
                algorithm,
                str(clients),
                "--budget",
                args.budget,
                "--precision",
                args.precision,
            ]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            rows.append(row(result, args))
            print(rows[-1], flush=True)
    if args.record:
        machine = f"{platform.machine()}, {os.cpu_count()} cores"
        text = RESULTS.read_text()
        section = "\n## Scale: N clients, 100 sampled per round (`benchmarks/scale.py`)\n"
        if section not in text:
            text += section + f"\nMachine: {machine}.\n\n{HEADER}\n"
        RESULTS.write_text(text.rstrip("\n") + "\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
