"""Sheaf-FMTL's set-up on the whole job: seconds to draw the maps and memory per client actor,
old code against new, in one sitting.

Runs jobs/sheaf_fmtl_rotated_fmnist.yaml (40 clients, 2 client actors of 20, the maps of one
seed ≈ 12.4 GB) as a user does, `python -m raymtl run`, one seed and `--rounds` rounds, for
this tree (*new*) and for the tree given by `--old` (e.g. the code before issue 20's changes,
unpacked with `git archive 65f12c7~1 | tar -x -C /tmp/sheaf_old`), imported first through
PYTHONPATH (Ray's workers inherit it; each run checks which tree it imported). The two
alternate `--repeats` times, each in a fresh process with a Ray of its own. Per run:

- *set-up s*: round 1's training phase less round 2's (phases.parquet): what round 1 pays
  beyond a round's training, the maps' drawing first (both trees draw them there);
- *drawing s*: the largest actor's seconds inside `init_maps` (map_draws.parquet; the old
  tree does not log it: "-");
- *peak GB*, *maps GB*, *above maps GB*: each client actor's peak resident memory
  (hosts.parquet, read after the final checkpoint), the maps its clients hold, and the
  difference (benchmarks/sheaf_memory.py `actor_memory`).

A run's folder (its final checkpoint holds every map) is deleted once read.

    .venv/bin/python benchmarks/sheaf_setup.py --old /tmp/sheaf_old --repeats 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from sheaf_memory import JOB, actor_memory

ROOT = Path(__file__).resolve().parents[1]


def setup_seconds(run_dir: Path) -> float:
    """Round 1's training phase less round 2's, in seconds."""
    phases = pd.read_parquet(run_dir / "phases.parquet")
    train = phases[phases["step"] == "train"].groupby("round")["seconds"].sum()
    return float(train.loc[1] - train.loc[2])


def run_once(tree: Path, label: str, rounds: int, scratch: Path) -> tuple[dict, pd.DataFrame]:
    """One `raymtl run` of the job on `tree`'s code: its row and its client actors' memory."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    probe = [sys.executable, "-c", "import raymtl; print(raymtl.__file__)"]
    imported = subprocess.run(probe, env=env, cwd=out, capture_output=True, text=True, check=True)
    if not imported.stdout.strip().startswith(str(tree)):
        sys.exit(f"--old: {tree} imported raymtl from {imported.stdout.strip()}")
    overrides = ["seeds=[0]", f"rounds={rounds}", f"output.dir={out}", "output.plots=false"]
    command = [sys.executable, "-m", "raymtl", "run", str(ROOT / JOB), *overrides]
    subprocess.run(command, env=env, check=True, cwd=out, stdout=subprocess.DEVNULL)
    (run_dir,) = [p for p in out.iterdir() if (p / "hosts.parquet").is_file()]
    actors = actor_memory(run_dir).assign(run=label)
    rounds_frame = pd.read_parquet(run_dir / "rounds.parquet").sort_values("round")
    wall = rounds_frame["wall_time"].to_numpy()
    drawing = actors["drawing s"].max()
    row = {
        "code": label,
        "set-up s": round(setup_seconds(run_dir), 1),
        "drawing s (largest actor)": "-" if pd.isna(drawing) else round(float(drawing), 1),
        "round 1 s": round(float(wall[0]), 1),
        "s/round after": round(float((wall[-1] - wall[0]) / (len(wall) - 1)), 2),
        "peak GB (largest actor)": actors["peak GB"].max(),
        "above maps GB (largest)": actors["above maps GB"].max(),
    }
    shutil.rmtree(out)
    return row, actors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the old tree (a raymtl checkout)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    rows, actors = [], []
    for repeat in range(args.repeats):
        for label, tree in (("old", args.old.resolve()), ("new", ROOT)):
            row, memory = run_once(tree, label, args.rounds, args.scratch)
            rows.append({"repeat": repeat + 1, **row})
            actors.append(memory.assign(repeat=repeat + 1))
            print(pd.DataFrame([rows[-1]]).to_string(index=False), flush=True)
    print()
    print(pd.DataFrame(rows).to_string(index=False))
    print()
    print(pd.concat(actors).to_string(index=False))


if __name__ == "__main__":
    main()
