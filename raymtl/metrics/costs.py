"""What a run cost beyond its final bits and time: the rounds, bits, FLOPs and wall time each
seed needed to reach a target metric (`metrics: {target, metric}`), and the peak memory of the
run's processes (hosts.parquet).

Both go into summary.json (`target`, `peak_memory`); report.py shows them in the results
table and api/comparison.py in table.csv.
"""

from __future__ import annotations

import math

import pandas as pd

from raymtl.metrics.statistics import evaluated_rounds, mean_and_std

# Metrics reached from above (the target is a ceiling); every other is reached from below.
LOWER_IS_BETTER = ("mean_loss",)


def first_round_reaching(seed_rounds: pd.DataFrame, metric: str, target: float) -> pd.Series | None:
    """The row of the first evaluated round whose `metric` reaches `target` (>=, or <= for a
    loss); None when no evaluated round does."""
    evaluated = evaluated_rounds(seed_rounds).sort_values("round")
    values = evaluated[metric]
    reached = values <= target if metric in LOWER_IS_BETTER else values >= target
    reached = reached & values.notna()
    if not reached.any():
        return None
    return evaluated[reached].iloc[0]


def known(value) -> float | None:
    """A recorded figure, None when it is missing or NaN (runs recorded before it)."""
    return None if value is None or math.isnan(value) else float(value)


def stat_or_none(values: list[float]) -> dict[str, float] | None:
    """Mean and std over the seeds that reached the target; None when none did."""
    return mean_and_std(values) if values else None


def target_summary(rounds: pd.DataFrame, seeds: list[int], metric: str, target: float) -> dict:
    """Per seed, the first evaluated round reaching the target, with the cumulative bits,
    FLOPs and wall time at that round (None: not reached); across `seeds`, the fraction that reached
    it and the mean ± std of each figure over those that did."""
    per_seed = {}
    for seed in seeds:
        row = first_round_reaching(rounds[rounds["seed"] == seed], metric, target)
        per_seed[str(seed)] = None
        if row is not None:
            per_seed[str(seed)] = {
                "round": int(row["round"]),
                "bits": float(row["cum_bits"]),
                "flops": known(row.get("cum_flops")),
                "wall_time": float(row["wall_time"]),
            }
    reached = [figures for figures in per_seed.values() if figures is not None]
    return {
        "metric": metric,
        "target": float(target),
        "seeds": len(seeds),
        "seeds_reached": len(reached),
        "reached": len(reached) / len(seeds) if seeds else 0.0,
        "rounds": stat_or_none([figures["round"] for figures in reached]),
        "bits": stat_or_none([figures["bits"] for figures in reached]),
        "flops": stat_or_none([f["flops"] for f in reached if f["flops"] is not None]),
        "wall_time": stat_or_none([figures["wall_time"] for figures in reached]),
        "per_seed": per_seed,
    }


def peak_memory_summary(hosts: pd.DataFrame, seeds: list[int], one_process: bool) -> dict | None:
    """Peak resident memory of the run's processes (bytes), from hosts.parquet.

    Per seed: `total`, the sum over its hosts' peak RSS, and `largest_host`; across seeds,
    the mean ± std of each. Hosts of one process (`runtime.executor: inline`, `one_process`)
    all report that same process, so its total is its peak, not a sum. The driver's own
    process is not a host and is not counted (inline: the hosts run in it). None when
    hosts.parquet has no row for any of `seeds` (runs from before it existed).
    """
    if hosts.empty or "peak_rss" not in hosts:
        return None
    hosts = hosts[hosts["seed"].isin(seeds)]
    if hosts.empty:
        return None
    # One figure per (seed, host): the highest, should a host have been recorded twice.
    peaks = hosts.groupby(["seed", "host"])["peak_rss"].max()
    per_seed = {}
    for seed, seed_peaks in peaks.groupby(level="seed"):
        largest = float(seed_peaks.max())
        total = largest if one_process else float(seed_peaks.sum())
        per_seed[str(int(seed))] = {
            "total_bytes": total,
            "largest_host_bytes": largest,
            "hosts": int(len(seed_peaks)),
        }
    return {
        "one_process": one_process,
        "total_bytes": mean_and_std([figures["total_bytes"] for figures in per_seed.values()]),
        "largest_host_bytes": mean_and_std(
            [figures["largest_host_bytes"] for figures in per_seed.values()]
        ),
        "per_seed": per_seed,
    }


def format_bytes(size: float) -> str:
    """Memory in decimal units, MB below a gigabyte: 2.5e9 -> '2.50 GB', 3.4e8 -> '340 MB'."""
    if size is None or math.isnan(size):
        return "-"
    if size >= 1e9:
        return f"{size / 1e9:.2f} GB"
    return f"{size / 1e6:.0f} MB"
