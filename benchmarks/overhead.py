"""What does running a federation on Ray actors cost over a plain PyTorch loop?

(a) raymtl: FedAvg on Ray actors (client actors, object store, router), driven round by
    round through the public `raymtl.Federation`.
(b) the same client updates in one process: the same partition, initial model,
    per-client seeds and local SGD, called in a plain `for` loop.

Both time the rounds only (evaluation once, at the end, in both); Ray's start-up
and the actors' set-up (imports, data loading) are reported separately.

    .venv/bin/python benchmarks/overhead.py                       # Fashion-MNIST CNN
    .venv/bin/python benchmarks/overhead.py --dataset digits
    .venv/bin/python benchmarks/overhead.py --record              # append to RESULTS.md
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

import raymtl
from raymtl.config import parse_config
from raymtl.data import materialize
from raymtl.extend import (
    LocalTrainingParams,
    client_name,
    derive_seed,
    evaluate,
    load_tensors,
    local_sgd,
    model_tensors,
    weighted_average,
)
from raymtl.models import build_model
from raymtl.runtime.executors.planning import (
    partition,  # the same clients' shards for the plain loop
)

RESULTS = Path(__file__).with_name("RESULTS.md")


def experiment(args, out: Path) -> dict:
    return {
        "name": "overhead",
        "data": {
            "name": args.dataset,
            "num_clients": args.clients,
            "partition": {
                "kind": "classes_per_client",
                "classes_per_client": 2,
                "max_samples_per_client": args.max_samples,
            },
        },
        "model": {"name": "cnn_mnist"},
        "algorithm": {"name": "fedavg", "params": {"epochs": args.epochs, "lr": 0.05}},
        "rounds": args.rounds,
        "eval_every": args.rounds,
        "checkpoint_every": args.rounds,
        "runtime": {"executor": "ray", "dashboard": False, "precision": args.precision},
        "output": {"dir": str(out), "plots": False},
    }


def run_on_ray(cfg) -> dict:
    """(a): the federation on Ray actors, round by round; its rounds' time from its rows.
    A Ray this process runs already (benchmarks/gpu_check.py's runs one after another) is
    used as it is (Ray start 0)."""
    import ray

    began = time.perf_counter()
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=cfg.runtime.num_cpus,
            include_dashboard=False,
            log_to_driver=False,
        )
    ray_start = time.perf_counter() - began
    began = time.perf_counter()
    with raymtl.Federation(cfg) as federation:  # the actors start (Ray is reused)
        setup = time.perf_counter() - began
        while not federation.done:
            event = federation.run_round()
    return {
        "ray_start_s": ray_start,
        "setup_s": setup,
        "rounds_s": float(event.row["wall_time"]),
        "accuracy": float(event.row["mean_accuracy"]),
    }


def run_plain(cfg, device: str = "cpu") -> dict:
    """(b): the same FedAvg client updates in one process, one after the other, on `device`
    (the model and every client's tensors there, as a host puts them)."""
    seed = cfg.seeds[0]
    began = time.perf_counter()
    pools, shards, _, _ = partition(cfg, seed)
    pool = pools[cfg.data.name]
    clients = [materialize(pool, shard, seed) for shard in shards]
    for data in clients:
        for name in ("train_x", "train_y", "test_x", "test_y"):
            setattr(data, name, getattr(data, name).to(device))
    torch.manual_seed(derive_seed(seed, "model-init"))
    model = build_model("cnn_mnist", tuple(pool.x.shape[1:]), pool.num_classes).to(device)
    global_state = model_tensors(model)
    params: LocalTrainingParams = cfg.algorithm.typed_params()
    setup = time.perf_counter() - began
    began = time.perf_counter()
    for round_index in range(1, cfg.rounds + 1):
        updates = []
        for i, data in enumerate(clients):
            load_tensors(model, global_state)
            train_seed = derive_seed(seed, round_index, client_name(i), "train")
            local_sgd(model, data.train_x, data.train_y, params, train_seed)
            updates.append((model_tensors(model), len(data.train_y)))
        global_state = weighted_average(updates)
        if round_index == 1:
            first_round_end = time.perf_counter()
    rounds = time.perf_counter() - began
    load_tensors(model, global_state)
    accuracy = np.mean([evaluate(model, d.test_x, d.test_y)["accuracy"] for d in clients])
    return {
        "setup_s": setup,
        "rounds_s": rounds,
        "accuracy": float(accuracy),
        "first_round_end": first_round_end,  # time.perf_counter() at round 1's end
    }


def record(args, ray_result: dict, plain_result: dict, ratio: float) -> None:
    """Append one row to RESULTS.md (machine, date, command, figures)."""
    command = (
        f"benchmarks/overhead.py --dataset {args.dataset} --clients {args.clients} "
        f"--rounds {args.rounds} --epochs {args.epochs} --max-samples {args.max_samples}"
        + (f" --precision {args.precision}" if args.precision != "fp32" else "")
    )
    machine = f"{platform.machine()}, {torch.get_num_threads()} torch threads, CPU only"
    row = (
        f"| {date.today()} | {machine} | `{command}` | {ray_result['rounds_s']:.1f} | "
        f"{plain_result['rounds_s']:.1f} | **{ratio:.2f}** | {ray_result['ray_start_s']:.1f} | "
        f"{ray_result['setup_s']:.1f} | {ray_result['accuracy']:.3f} / "
        f"{plain_result['accuracy']:.3f} |\n"
    )
    # Into the overhead table (the file holds other benchmarks' sections after it).
    lines = RESULTS.read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if line.startswith("| date | machine |"))
    end = header
    while end + 1 < len(lines) and lines[end + 1].startswith("|"):
        end += 1
    lines.insert(end + 1, row)
    RESULTS.write_text("".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-samples", type=int, default=500)
    parser.add_argument("--out", default="runs/bench-overhead")
    parser.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "bf16-mixed"],
        help="raymtl's runtime.precision for (a); the plain loop (b) stays fp32",
    )
    parser.add_argument("--record", action="store_true", help="append the result to RESULTS.md")
    args = parser.parse_args()
    cfg = parse_config(experiment(args, Path(args.out)))
    plain_result = run_plain(cfg)
    ray_result = run_on_ray(cfg)
    ratio = ray_result["rounds_s"] / plain_result["rounds_s"]
    plain, remote = plain_result, ray_result
    print(f"plain loop : rounds {plain['rounds_s']:.1f} s (set-up {plain['setup_s']:.1f} s)")
    print(
        f"raymtl/Ray : rounds {remote['rounds_s']:.1f} s "
        f"(Ray start {remote['ray_start_s']:.1f} s, actors' set-up {remote['setup_s']:.1f} s)"
    )
    print(
        f"ratio a/b  : {ratio:.2f}   final accuracy ray {remote['accuracy']:.3f}"
        f" / plain {plain['accuracy']:.3f}"
    )
    if args.record:
        record(args, ray_result, plain_result, ratio)


if __name__ == "__main__":
    main()
