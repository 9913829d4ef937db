"""Reporter of ifca_clusters.parquet (IFCA): how well the clients' cluster picks recover the
true groups.

Rows: (seed, round, client, cluster, stage, group, task, loss): a client's pick of the K
cluster models, when it trains ("train") and when it is evaluated ("eval": every client, every
round). Adds `summary["ifca"]`:
  ari_last     adjusted Rand index of the last round's evaluation picks against the true
               groups (mean/std over seeds), as SFMTL-Graph's communities are scored
  ari_mean     the same ARI averaged over the rounds
  clusters_used  distinct clusters picked in the last round (mean over seeds)
The truth is the rotation/mask `group` when the federation has groups, the `task` when the
clients' tasks differ, both together when both vary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from raymtl.metrics.extras import table_reporter
from raymtl.metrics.statistics import adjusted_rand_score, mean_and_std


def truth(rows: pd.DataFrame) -> pd.Series:
    """The true group of each row: group, task, or both (whichever vary)."""
    varying = [column for column in ("group", "task") if rows[column].nunique() > 1]
    if not varying:
        return pd.Series(0, index=rows.index)
    return rows[varying].astype(str).agg(":".join, axis=1)


def seed_figures(rows: pd.DataFrame) -> dict[str, float]:
    """ARI of every round's evaluation picks; the last round's and their mean."""
    by_round = {
        round_index: float(adjusted_rand_score(truth(picks), picks["cluster"]))
        for round_index, picks in rows.sort_values("client").groupby("round")
    }
    last = rows[rows["round"] == rows["round"].max()]
    return {
        "ari_last": by_round[max(by_round)],
        "ari_mean": float(np.mean(list(by_round.values()))),
        "clusters_used": float(last["cluster"].nunique()),
    }


@table_reporter("ifca_clusters")
def report_ifca(run_dir: Path, summary: dict) -> None:
    """Add summary['ifca']."""
    table = pd.read_parquet(Path(run_dir) / "ifca_clusters.parquet")
    evaluated = table[table["stage"] == "eval"]
    if evaluated.empty:
        return
    per_seed = {int(seed): seed_figures(rows) for seed, rows in evaluated.groupby("seed")}
    keys = ("ari_last", "ari_mean", "clusters_used")
    summary["ifca"] = {
        **{key: mean_and_std([figures[key] for figures in per_seed.values()]) for key in keys},
        "per_seed": per_seed,
    }
