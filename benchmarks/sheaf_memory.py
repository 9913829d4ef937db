"""Seconds per round and peak memory per client actor: Sheaf-FMTL next to its baselines.

Reads a comparison directory written by

    raymtl compare jobs/sheaf_fmtl_rotated_fmnist.yaml \
        "algorithm.name=sheaf_fmtl,dfedu,dpsgd,local" --out runs/sheaf_rotated

(or runs one with --run, a few rounds and one seed) and prints one row per algorithm:
seconds per round (the rounds after the first, whose set-up includes drawing the maps), the
first round, the seconds the largest actor spent drawing maps (map_draws.parquet; runs
written before it was logged: "-"), the peak resident memory of the largest client actor
(hosts.parquet), and the bits per directed edge and round. A second table gives every
client actor of every seed: the bytes of maps its clients hold (map_draws.parquet, else from
the projections' sizes: d_ij = bits / 64 a round, d_i = the model's parameters) and its
peak resident memory above them. Clients sit on actors in contiguous blocks, as many as
hosts.parquet lists (runtime.clients_per_actor when the run set it).

    python benchmarks/sheaf_memory.py --compare-dir runs/sheaf_rotated
    python benchmarks/sheaf_memory.py --run --rounds 4
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

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


def client_maps(run_dir: Path) -> pd.DataFrame:
    """Bytes of maps each client holds, by (seed, client); empty for runs without maps."""
    draws = run_dir / "map_draws.parquet"
    if draws.is_file():
        table = pd.read_parquet(draws)
        return table.rename(columns={"i": "client"})[["seed", "client", "bytes", "seconds"]]
    messages = pd.read_parquet(run_dir / "messages.parquet")
    sent = messages[(messages["kind"] == "projection") & (messages["round"] == 1)]
    if sent.empty:
        return pd.DataFrame(columns=["seed", "client", "bytes", "seconds"])
    d_ij = sent.groupby(["seed", "src", "dst"])["bits"].sum() // 64  # two sends of d_ij floats
    clients = pd.read_parquet(run_dir / "clients.parquet")
    d_i = clients.drop_duplicates(["seed", "client"]).set_index(["seed", "client"])
    rows = []
    for (seed, src, _), rows_ij in d_ij.items():
        client = int(src.split("/")[1])
        rows.append((seed, client, 4 * int(rows_ij) * int(d_i.loc[(seed, client), "model_params"])))
    table = pd.DataFrame(rows, columns=["seed", "client", "bytes"])
    table = table.groupby(["seed", "client"], as_index=False)["bytes"].sum()
    return table.assign(seconds=float("nan"))


def host_of(run_dir: Path, actors: int) -> dict[int, str]:
    """Client -> its actor's name: contiguous blocks (placement.client_blocks)."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    n = config["data"]["num_clients"]
    per_actor = config.get("runtime", {}).get("clients_per_actor", "auto")
    if per_actor == "auto":
        per_actor = math.ceil(n / actors)
    return {i: f"clients-{i // per_actor}" for i in range(n)}


def actor_memory(run_dir: Path) -> pd.DataFrame:
    """Each client actor of each seed: maps held, peak resident memory, the difference."""
    hosts = pd.read_parquet(run_dir / "hosts.parquet")
    hosts = hosts[hosts["host"].str.startswith("clients")]
    maps = client_maps(run_dir)
    placed = host_of(run_dir, hosts["host"].nunique())
    maps = maps.assign(host=maps["client"].map(placed))
    held = maps.groupby(["seed", "host"])[["bytes", "seconds"]].sum(min_count=1).reset_index()
    table = hosts.merge(held, on=["seed", "host"], how="left").fillna({"bytes": 0})
    return pd.DataFrame(
        {
            "run": run_dir.name,
            "seed": table["seed"],
            "actor": table["host"],
            "maps GB": (table["bytes"] / 1e9).round(2),
            "peak GB": (table["peak_rss"] / 1e9).round(2),
            "above maps GB": ((table["peak_rss"] - table["bytes"]) / 1e9).round(2),
            "drawing s": table["seconds"].round(1),
        }
    )


def row(run_dir: Path, actors: pd.DataFrame) -> dict:
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    later, first = per_round_seconds(rounds)
    drawing = actors["drawing s"].max()
    return {
        "run": run_dir.name,
        "s/round": round(later, 2),
        "round 1 s": round(first, 1),
        "drawing s (largest actor)": "-" if pd.isna(drawing) else round(float(drawing), 1),
        "peak GB per client actor": actors["peak GB"].max(),
        "client actors": int(actors["actor"].nunique()),
        "bits per edge and round": int(edge_bits(pd.read_parquet(run_dir / "messages.parquet"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare-dir", type=Path, default=Path("runs/sheaf_rotated"))
    parser.add_argument("--run", action="store_true", help="run a short comparison first")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.run:
        command = ["raymtl", "compare", JOB, "algorithm.name=sheaf_fmtl,dfedu", "seeds=[0]"]
        command += [f"rounds={args.rounds}", "--out", str(args.compare_dir)]
        subprocess.run(command, check=True)
    runs = sorted(p for p in args.compare_dir.iterdir() if (p / "hosts.parquet").is_file())
    if not runs:
        sys.exit(f"no runs with hosts.parquet under {args.compare_dir}")
    actors = {run: actor_memory(run) for run in runs}
    print(pd.DataFrame([row(run, actors[run]) for run in runs]).to_string(index=False))
    print()
    print(pd.concat(actors.values()).to_string(index=False))


if __name__ == "__main__":
    main()
