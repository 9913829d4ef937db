#!/usr/bin/env bash
# `raymtl up` and a run with a plugin: consecutive runs of examples/fedavgm (its plugin copied
# into a scratch folder) on the service's warm actors, the plugin unchanged, then edited
# before every run (a comment with the run's time: a new sha256, so the actors run it again).
# Then `raymtl list --plugin` on the service. Prints hyperfine's tables and the warm actors
# each run used (hosts.parquet).
#
#     bash benchmarks/up_plugins.sh            # needs `make install` and hyperfine
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
raymtl="$here/.venv/bin/raymtl"
scratch=$(mktemp -d)
export RAYMTL_HOME="$scratch/home"
cp "$here/examples/fedavgm/fedavgm.py" "$scratch/"
sed -e 's/^rounds: 30/rounds: 2/' -e 's/^seeds: \[0, 1, 2\]/seeds: [0]/' \
    -e "s|^  dir: runs|  dir: $scratch/runs|" \
    "$here/examples/fedavgm/fedavgm_digits.yaml" > "$scratch/fedavgm_digits.yaml"
trap '"$raymtl" down >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
"$raymtl" up --num-cpus 2
hyperfine --shell bash --runs 4 --export-markdown "$scratch/unchanged.md" \
    "$raymtl run $scratch/fedavgm_digits.yaml"
hyperfine --shell bash --runs 4 --export-markdown "$scratch/edited.md" \
    --prepare "echo \"# edit \$RANDOM\$RANDOM\" >> $scratch/fedavgm.py" \
    "$raymtl run $scratch/fedavgm_digits.yaml"
hyperfine --shell bash --runs 4 --export-markdown "$scratch/list.md" \
    "$raymtl list --plugin $scratch/fedavgm.py"
cat "$scratch/unchanged.md" "$scratch/edited.md" "$scratch/list.md"
"$here/.venv/bin/python" - "$scratch/runs" <<'PY'
import sys
from pathlib import Path

import pandas as pd

runs = sorted(Path(sys.argv[1]).iterdir(), key=lambda p: p.stat().st_mtime)
actors = [frozenset(pd.read_parquet(run / "hosts.parquet")["actor"]) for run in runs]
startup = [pd.read_parquet(run / "startup.parquet").iloc[0] for run in runs]
print(f"{len(runs)} runs; distinct sets of actors: {len(set(actors))}; "
      f"actors in all: {len(set().union(*actors))}")
for run, row in zip(runs, startup):
    print(f"{run.name}: joined_up={bool(row['joined_up'])} hosts_up_s={row['hosts_up_s']:.2f} "
          f"build_s={row['build_s']:.2f} process_s={row['process_s']:.2f}")
PY
