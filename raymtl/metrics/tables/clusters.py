"""Reporter and plotter of the one-shot clustering tables (the `oneshot_hfl` algorithm).

Tables written by the algorithm's steps:
    oneshot_clusters  (seed, round, client, lps, task, method)   the users' LPS
    oneshot_relevance (seed, round, i, j, r, R)                  r(i, j), R = (r + rᵀ)/2
    oneshot_linkage   (seed, round, step, a, b, distance, size)  scipy's linkage matrix Z
    oneshot_features  (seed, round, client, feature_map, dim, k, samples)
Summary (`summary["clustering"]`): adjusted Rand index of LPS vs true task per seed and
mean ± std; per task and per LPS final accuracy (the mean over its users per seed, then
mean ± std over seeds); bits of the clustering phase vs one round of training.
Plots: R heatmap, dendrogram, accuracy per task / per LPS over rounds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from raymtl.metrics.extras import table_plotter, table_reporter
from raymtl.metrics.figures import new_figure, save_figure
from raymtl.metrics.statistics import mean_and_std

CLUSTERING_KINDS = ("eigenvectors", "relevance", "similarity", "clusters", "membership")
TRAINING_KINDS = ("model", "common", "lps_model")


def read(run_dir: Path, table: str) -> pd.DataFrame:
    path = Path(run_dir) / f"{table}.parquet"
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame()


def adjusted_rand(clusters: pd.DataFrame) -> dict[int, float]:
    """ARI of the LPS assignment vs the true tasks, per seed."""
    from sklearn.metrics import adjusted_rand_score

    return {
        int(seed): float(adjusted_rand_score(rows["task"], rows["lps"]))
        for seed, rows in clusters.sort_values("client").groupby("seed")
    }


def final_accuracy_by(clients: pd.DataFrame, clusters: pd.DataFrame, column: str) -> dict:
    """{task or lps: mean ± std over seeds} of the mean accuracy of its users, last round."""
    frame = with_lps(clients, clusters)
    last = frame[frame["round"] == frame.groupby("seed")["round"].transform("max")]
    per_seed = last.groupby([column, "seed"])["accuracy"].mean()
    return {
        str(key): {**mean_and_std(list(values)), "per_seed": [float(v) for v in values]}
        for key, values in per_seed.groupby(level=0)
    }


def with_lps(clients: pd.DataFrame, clusters: pd.DataFrame) -> pd.DataFrame:
    assignment = clusters[["seed", "client", "lps"]].drop_duplicates(["seed", "client"])
    return clients.drop(columns=["lps"], errors="ignore").merge(assignment, on=["seed", "client"])


def bits_summary(messages: pd.DataFrame) -> dict:
    """Mean over seeds: bits of the clustering phase and of one round of training."""
    if messages.empty:
        return {}
    clustering = messages[messages["kind"].isin(CLUSTERING_KINDS)]
    training = messages[messages["kind"].isin(TRAINING_KINDS)]
    per_round = training.groupby(["seed", "round"])["bits"].sum()
    by_kind = clustering.groupby(["seed", "kind"])["bits"].sum().groupby(level=1).mean()
    seeds = messages["seed"].nunique()
    return {
        "clustering_bits": float(clustering["bits"].sum() / seeds),
        "clustering_bits_by_kind": {str(k): float(v) for k, v in by_kind.items()},
        "training_round_bits": float(per_round.groupby(level=1).mean().max())
        if not per_round.empty
        else 0.0,
    }


@table_reporter("oneshot_clusters")
def report_clusters(run_dir: Path, summary: dict) -> None:
    run_dir = Path(run_dir)
    clusters, clients = read(run_dir, "oneshot_clusters"), read(run_dir, "clients")
    features = read(run_dir, "oneshot_features")
    ari = adjusted_rand(clusters)
    result = {
        "method": str(clusters["method"].iloc[0]),
        "ari_per_seed": {str(seed): value for seed, value in ari.items()},
        "ari": mean_and_std(list(ari.values())),
        "assignment": {
            str(seed): rows.sort_values("client")["lps"].astype(int).tolist()
            for seed, rows in clusters.groupby("seed")
        },
        "feature_map": sorted(features["feature_map"].unique()) if not features.empty else [],
        **bits_summary(read(run_dir, "messages")),
    }
    if not clients.empty:
        result["task_accuracy"] = final_accuracy_by(clients, clusters, "task")
        result["lps_accuracy"] = final_accuracy_by(clients, clusters, "lps")
    summary["clustering"] = result


@table_plotter("oneshot_clusters")
def plot_clusters(run_dir: Path) -> list[Path]:
    """R heatmap and dendrogram (first seed), accuracy per task and per LPS over rounds."""
    run_dir = Path(run_dir)
    clusters, clients = read(run_dir, "oneshot_clusters"), read(run_dir, "clients")
    out = run_dir / "plots"
    figures = {}
    relevance, linkage = read(run_dir, "oneshot_relevance"), read(run_dir, "oneshot_linkage")
    seed = int(clusters["seed"].min())
    if not relevance.empty:
        figures["relevance_heatmap.png"] = heatmap(relevance[relevance["seed"] == seed], seed)
    if not linkage.empty:
        figures["dendrogram.png"] = dendrogram(linkage[linkage["seed"] == seed], clusters, seed)
    if not clients.empty:
        frame = with_lps(clients, clusters)
        figures["accuracy_per_task.png"] = accuracy_curves(frame, "task")
        figures["accuracy_per_lps.png"] = accuracy_curves(frame, "lps")
    return [save_figure(figure, out / name) for name, figure in figures.items()]


def heatmap(relevance: pd.DataFrame, seed: int):
    matrix = relevance.pivot(index="i", columns="j", values="R").sort_index()
    figure = new_figure(figsize=(5.5, 4.5))
    axes = figure.add_subplot()
    image = axes.imshow(matrix.to_numpy(), vmin=0, vmax=1, cmap="viridis")
    for (i, j), value in np.ndenumerate(matrix.to_numpy()):
        axes.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6, color="w")
    figure.colorbar(image, ax=axes, label="R(i, j)")
    axes.set(xlabel="user j", ylabel="user i", title=f"data relevance R (seed {seed})")
    axes.set_xticks(range(len(matrix)))
    axes.set_yticks(range(len(matrix)))
    return figure


def dendrogram(linkage: pd.DataFrame, clusters: pd.DataFrame, seed: int):
    from scipy.cluster.hierarchy import dendrogram as scipy_dendrogram

    z = linkage.sort_values("step")[["a", "b", "distance", "size"]].to_numpy(dtype=float)
    rows = clusters[clusters["seed"] == seed].sort_values("client")
    labels = [f"user {c} (task {t})" for c, t in zip(rows["client"], rows["task"], strict=True)]
    figure = new_figure(figsize=(6, 4))
    axes = figure.add_subplot()
    scipy_dendrogram(z, labels=labels, ax=axes, leaf_rotation=90)
    axes.set(ylabel="1 − R (linkage distance)", title=f"HAC dendrogram (seed {seed})")
    return figure


def accuracy_curves(frame: pd.DataFrame, column: str):
    """Mean accuracy of each task's (LPS's) users per round: mean ± std over seeds."""
    figure = new_figure(figsize=(6, 4))
    axes = figure.add_subplot()
    per_seed = frame.groupby([column, "seed", "round"])["accuracy"].mean()
    for key, curve in per_seed.groupby(level=0):
        stats = curve.groupby(level=2).agg(["mean", "std"]).fillna(0.0)
        axes.plot(stats.index, stats["mean"], label=f"{column} {key}")
        axes.fill_between(
            stats.index, stats["mean"] - stats["std"], stats["mean"] + stats["std"], alpha=0.2
        )
    axes.set(xlabel="round", ylabel="accuracy", title=f"accuracy per {column} (± std over seeds)")
    axes.legend()
    return figure
