"""Evaluation at scale: N one-sample clients evaluated one by one against together.

FedAvg on Fashion-MNIST with the MNIST CNN, IID, 7 samples per client (6 train / 1 test),
100 clients sampled in the one round, every client evaluated after it. *alone* is the code
before batched evaluation (every client through the model on its own: the host's
`_together` patched to singletons); *together* is the default (clients that share the
evaluation model go through it together, tasks/objectives.py `evaluate_together`). The
figure is rounds.parquet's `seconds_evaluate` (the driver's wall time of the evaluation
call, all hosts). Each configuration runs in a fresh process; the per-client rows of the
two are compared (equal accuracy, loss within 1e-6).

    .venv/bin/python benchmarks/evaluation.py                      # inline, N = 1,000 and 10,000
    .venv/bin/python benchmarks/evaluation.py --executor ray
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

SAMPLED, SAMPLES_PER_CLIENT = 100, 7


def experiment(clients: int, executor: str, run_dir: str) -> dict:
    return {
        "name": f"evaluation-{clients}",
        "data": {
            "name": "fashion_mnist",
            "num_clients": clients,
            "partition": {"kind": "iid", "max_samples_per_client": SAMPLES_PER_CLIENT},
        },
        "model": {"name": "cnn_mnist"},
        "algorithm": {
            "name": "fedavg",
            "params": {"epochs": 1, "lr": 0.05, "sample_fraction": SAMPLED / clients},
        },
        "rounds": 1,
        "seeds": [0],
        "runtime": {"executor": executor, "dashboard": False},
        "output": {"dir": run_dir, "plots": False},
    }


def one(clients: int, executor: str, mode: str) -> None:
    """Run one configuration in this process and print its figures as JSON."""
    import raymtl
    from raymtl.runtime.host import ParticipantHost

    if mode == "alone":
        ParticipantHost._together = lambda self, participants: [[p] for p in participants]
    with tempfile.TemporaryDirectory() as run_dir:
        results = raymtl.run(experiment(clients, executor, run_dir))
        clients_frame = results.clients.sort_values("client")
        print(
            json.dumps(
                {
                    "seconds_evaluate": float(results.rounds["seconds_evaluate"].iloc[0]),
                    "accuracy": clients_frame["accuracy"].tolist(),
                    "loss": clients_frame["loss"].tolist(),
                }
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executor", choices=("inline", "ray"), default="inline")
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--one", nargs=2, metavar=("CLIENTS", "MODE"))
    args = parser.parse_args()
    if args.one:
        one(int(args.one[0]), args.executor, args.one[1])
        return
    print("| N | executor | alone s | together s | speed-up | rows equal |")
    print("|---|---|---|---|---|---|")
    for clients in args.clients:
        figures = {}
        for mode in ("alone", "together"):
            command = [sys.executable, __file__, "--executor", args.executor]
            command += ["--one", str(clients), mode]
            output = subprocess.run(command, capture_output=True, text=True, check=True)
            figures[mode] = json.loads(output.stdout.strip().splitlines()[-1])
        alone, together = figures["alone"], figures["together"]
        equal = alone["accuracy"] == together["accuracy"] and all(
            abs(a - b) <= 1e-6 * max(1.0, abs(a))
            for a, b in zip(alone["loss"], together["loss"], strict=True)
        )
        speedup = alone["seconds_evaluate"] / together["seconds_evaluate"]
        print(
            f"| {clients:,} | {args.executor} | {alone['seconds_evaluate']:.2f} | "
            f"{together['seconds_evaluate']:.2f} | {speedup:.1f}× | {equal} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
