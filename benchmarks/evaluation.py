"""Evaluation at scale: N one-sample clients evaluated, old code against new.

FedAvg on Fashion-MNIST with the MNIST CNN, IID, 7 samples per client (6 train / 1 test),
100 clients sampled in the one round, every client evaluated after it. *new* is this tree;
*old* is another tree of raymtl given by `--old` (e.g. the last commit, unpacked with `git
archive HEAD | tar -x -C /tmp/eval_old`), imported first through PYTHONPATH (Ray's workers
inherit it). The figure is rounds.parquet's `seconds_evaluate` (the driver's wall time of
the evaluation call, all hosts), the median of `--repeats` runs, each in a fresh process;
the per-client rows of old and new are compared (equal accuracy, loss within 1e-6).

    .venv/bin/python benchmarks/evaluation.py --old /tmp/eval_old                 # inline
    .venv/bin/python benchmarks/evaluation.py --old /tmp/eval_old --executor ray  # 2 actors
    .venv/bin/python benchmarks/evaluation.py --old /tmp/eval_old --clients 1000 \
        --algorithm local --sampled 1000 --model mlp        # every client its own weights
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SAMPLED, SAMPLES_PER_CLIENT = 100, 7


def experiment(
    clients: int,
    executor: str,
    run_dir: str,
    algorithm: str = "fedavg",
    model: str = "cnn_mnist",
    sampled: int = SAMPLED,
) -> dict:
    return {
        "name": f"evaluation-{clients}",
        "data": {
            "name": "fashion_mnist",
            "num_clients": clients,
            "partition": {"kind": "iid", "max_samples_per_client": SAMPLES_PER_CLIENT},
        },
        "model": {"name": model},
        "algorithm": {
            "name": algorithm,
            "params": {"epochs": 1, "lr": 0.05, "sample_fraction": min(1.0, sampled / clients)},
        },
        "rounds": 1,
        "seeds": [0],
        "runtime": {"executor": executor, "dashboard": False},
        "output": {"dir": run_dir, "plots": False},
    }


def one(clients: int, args: argparse.Namespace) -> None:
    """Run one configuration in this process and print its figures as JSON."""
    import raymtl

    with tempfile.TemporaryDirectory() as run_dir:
        config = experiment(
            clients, args.executor, run_dir, args.algorithm, args.model, args.sampled
        )
        results = raymtl.run(config)
        clients_frame = results.clients.sort_values("client")
        print(
            json.dumps(
                {
                    "code": str(Path(raymtl.__file__).parent.parent),
                    "seconds_evaluate": float(results.rounds["seconds_evaluate"].iloc[0]),
                    "accuracy": clients_frame["accuracy"].tolist(),
                    "loss": clients_frame["loss"].tolist(),
                }
            )
        )


def run_once(clients: int, args: argparse.Namespace, tree: str | None) -> dict:
    """One configuration in a fresh process, on `tree`'s raymtl (None: this tree's)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--executor", args.executor, "--one", str(clients)]
    command += ["--algorithm", args.algorithm, "--model", args.model]
    command += ["--sampled", str(args.sampled)]
    # Run from the tree itself too: Ray's workers may look in the driver's folder first.
    cwd = tree if tree is not None else Path(__file__).resolve().parent.parent
    output = subprocess.run(command, capture_output=True, text=True, check=True, env=env, cwd=cwd)
    figures = json.loads(output.stdout.strip().splitlines()[-1])
    if tree is not None and not figures["code"].startswith(str(Path(tree).resolve())):
        raise RuntimeError(f"--old {tree}: the run imported raymtl from {figures['code']}")
    return figures


def spread(results: list[dict]) -> str:
    """Every run's seconds, in the order they ran."""
    return ", ".join(f"{result['seconds_evaluate']:.2f}" for result in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executor", choices=("inline", "ray"), default="inline")
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--old", help="another raymtl tree to compare with (e.g. HEAD's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--algorithm", default="fedavg", help="e.g. local: own weights")
    parser.add_argument("--model", default="cnn_mnist")
    parser.add_argument("--sampled", type=int, default=SAMPLED, help="clients trained")
    parser.add_argument("--one", type=int, metavar="CLIENTS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args)
        return
    trees = {"old": args.old, "new": None} if args.old else {"new": None}
    print(f"| N | executor | {' | '.join(f'{name} s' for name in trees)} | speed-up | rows equal |")
    print("|---|---|" + "---|" * len(trees) + "---|---|")
    for clients in args.clients:
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.repeats):  # old and new alternate: the same load for both
            for name, tree in trees.items():
                runs[name].append(run_once(clients, args, tree))
        seconds = {
            name: statistics.median(run["seconds_evaluate"] for run in results)
            for name, results in runs.items()
        }
        cells = " | ".join(f"{seconds[name]:.2f} ({spread(runs[name])})" for name in trees)
        reference = runs["old"][0] if args.old else runs["new"][0]
        equal = all(
            run["accuracy"] == reference["accuracy"]
            and all(
                abs(a - b) <= 1e-6 * max(1.0, abs(a))
                for a, b in zip(reference["loss"], run["loss"], strict=True)
            )
            for results in runs.values()
            for run in results
        )
        speedup = f"{seconds['old'] / seconds['new']:.1f}×" if args.old else "—"
        print(f"| {clients:,} | {args.executor} | {cells} | {speedup} | {equal} |", flush=True)


if __name__ == "__main__":
    main()
