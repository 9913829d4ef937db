"""Reporter of faults.parquet: every lost host and what the run did about it.

Rows: (seed, round in progress, host, node, during (the call that failed), recovery (its
number within the seed), action, rolled_back_to, seconds_lost, error). Adds
`summary["faults"]`:
  faults          hosts lost, over all seeds
  recoveries      roll-backs (each replays the rounds since the last complete checkpoint)
  rounds_replayed rounds run twice because of them
  seconds_lost    wall time from the start of the failed attempt to its failure
  hosts, nodes    which hosts and nodes were lost
  replans         client actors laid out anew on the nodes left (rows "re-planned: ..."),
                  not faults themselves
"""

from __future__ import annotations

from pathlib import Path

from raymtl.metrics.extras import table_reporter
from raymtl.metrics.recorder import Recorder


@table_reporter("faults")
def report_faults(run_dir: Path, summary: dict) -> None:
    rows = Recorder.load(run_dir).table("faults")
    if rows.empty:
        return
    replanned = rows["action"].str.startswith("re-planned")
    faults = rows[~replanned]
    attempts = faults.drop_duplicates(["seed", "recovery"])
    recovered = attempts[attempts["action"].str.startswith("rolled back")]
    summary["faults"] = {
        "faults": int(len(faults)),
        "recoveries": int(len(recovered)),
        "rounds_replayed": int((recovered["round"] - recovered["rolled_back_to"] - 1).sum()),
        "seconds_lost": float(attempts["seconds_lost"].sum()),
        "hosts": sorted(faults["host"].unique().tolist()),
        "nodes": sorted(faults["node"].unique().tolist()),
        "replans": int(replanned.sum()),
    }
