"""Seconds per round and peak memory per client actor: Sheaf-FMTL next to its baselines.

Reads a comparison directory written by

    raymtl compare jobs/sheaf_fmtl_rotated_fmnist.yaml \
        "algorithm.name=sheaf_fmtl,dfedu,dpsgd,local" --out runs/sheaf_rotated

(or runs one with --run, a few rounds and one seed) and prints one row per algorithm:
seconds per round (the rounds after the first, whose set-up includes drawing the maps), the
first round, the peak resident memory of the largest client actor (hosts.parquet), the
maps' memory the run printed before it started (from the algorithm's own estimate), and the
bits per directed edge and round.

    python benchmarks/sheaf_memory.py --compare-dir runs/sheaf_rotated
    python benchmarks/sheaf_memory.py --run --rounds 4
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

JOB = "jobs/sheaf_fmtl_rotated_fmnist.yaml"


def per_round_seconds(rounds: pd.DataFrame) -> tuple[float, float]:
    """Mean seconds of rounds 2.. and of round 1, over seeds (wall_time is cumulative)."""
    later, first = [], []
    for _, seed_rounds in rounds.groupby("seed"):
        wall = seed_rounds.sort_values("round")["wall_time"].to_numpy()
        first.append(wall[0])
        if len(wall) > 1:
            later.append((wall[-1] - wall[0]) / (len(wall) - 1))
    return float(pd.Series(later).mean()), float(pd.Series(first).mean())


def edge_bits(messages: pd.DataFrame) -> float:
    """Mean bits a client sends one neighbour in a round (models or projections)."""
    sent = messages[messages["kind"].isin(["model", "projection"])]
    if sent.empty:
        return 0.0
    return float(sent.groupby(["seed", "round", "src", "dst"])["bits"].sum().mean())


def row(run_dir: Path) -> dict:
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    hosts = pd.read_parquet(run_dir / "hosts.parquet")
    clients = hosts[hosts["host"].str.startswith("clients")]
    later, first = per_round_seconds(rounds)
    return {
        "run": run_dir.name,
        "s/round": round(later, 2),
        "round 1 s": round(first, 1),
        "peak GB per client actor": round(clients["peak_rss"].max() / 1e9, 2),
        "client actors": int(clients["host"].nunique()),
        "bits per edge and round": int(edge_bits(pd.read_parquet(run_dir / "messages.parquet"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-dir", type=Path, default=Path("runs/sheaf_rotated"))
    parser.add_argument("--run", action="store_true", help="run a short comparison first")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.run:
        command = ["raymtl", "compare", JOB, "algorithm.name=sheaf_fmtl,dfedu", "seeds=[0]",
                   f"rounds={args.rounds}", "--out", str(args.compare_dir)]  # fmt: skip
        subprocess.run(command, check=True)
    runs = sorted(p for p in args.compare_dir.iterdir() if (p / "hosts.parquet").is_file())
    if not runs:
        sys.exit(f"no runs with hosts.parquet under {args.compare_dir}")
    print(pd.DataFrame([row(run) for run in runs]).to_string(index=False))


if __name__ == "__main__":
    main()
