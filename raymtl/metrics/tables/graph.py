"""Reporter of graph.parquet (SFMTL-Graph): communities over rounds, similarity heatmap, ARI.

Rows: (seed, round, i, j, s_ij, fs_ij, as_ij, community_i, true_group_i, modularity), one per
ordered pair of the round's sampled clients. Adds `summary["graph"]`:
  ari_last            ARI of the last round's communities vs the true groups (mean/std over seeds)
  ari_mean            ARI averaged over all rounds (mean/std over seeds)
  stability           ARI between consecutive rounds' communities on the clients sampled in
                      both rounds (1 = the same partition), averaged over rounds
  communities_last    number of communities in the last round
  modularity_last     modularity of the last round's partition
and draws plots/communities_over_rounds.png (client × round, colour = community, like the
paper's Table I) and plots/similarity_last.png (the last round's s_ij).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from raymtl.metrics.extras import table_plotter, table_reporter
from raymtl.metrics.figures import new_figure, save_figure
from raymtl.metrics.statistics import adjusted_rand_score


def memberships(graph: pd.DataFrame) -> pd.DataFrame:
    """One row per (seed, round, client): its community and true group."""
    nodes = graph[graph["i"] == graph["j"]] if "true_group_i" in graph else graph
    columns = ["seed", "round", "i", "community_i", "true_group_i", "modularity"]
    return nodes.drop_duplicates(["seed", "round", "i"])[columns].sort_values(
        ["seed", "round", "i"]
    )


def round_ari(rows: pd.DataFrame) -> float:
    """ARI of one round's communities vs the true groups (over its sampled clients)."""
    return float(adjusted_rand_score(rows["true_group_i"], rows["community_i"]))


def stability(seed_rows: pd.DataFrame) -> float:
    """Mean ARI between consecutive rounds' partitions on the clients both rounds sampled."""
    rounds = sorted(seed_rows["round"].unique())
    scores = []
    for before, after in zip(rounds, rounds[1:], strict=False):
        a = seed_rows[seed_rows["round"] == before].set_index("i")["community_i"]
        b = seed_rows[seed_rows["round"] == after].set_index("i")["community_i"]
        common = a.index.intersection(b.index)
        if len(common) >= 2:
            scores.append(adjusted_rand_score(a[common], b[common]))
    return float(np.mean(scores)) if scores else float("nan")


def mean_std(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    return {"mean": float(np.nanmean(array)), "std": float(np.nanstd(array))}


def seed_figures(seed_rows: pd.DataFrame) -> dict[str, float]:
    """The per-seed figures of summary['graph']."""
    by_round = {r: rows for r, rows in seed_rows.groupby("round")}
    last = by_round[max(by_round)]
    return {
        "ari_last": round_ari(last),
        "ari_mean": float(np.mean([round_ari(rows) for rows in by_round.values()])),
        "stability": stability(seed_rows),
        "communities_last": float(last["community_i"].nunique()),
        "modularity_last": float(last["modularity"].iloc[0]),
    }


def plot_communities(seed_rows: pd.DataFrame, path: Path) -> Path:
    """Client × round grid; colour = community label, blank = not sampled that round."""
    clients = sorted(seed_rows["i"].unique())
    rounds = sorted(seed_rows["round"].unique())
    grid = np.full((len(clients), len(rounds)), np.nan)
    for row in seed_rows.itertuples():
        grid[clients.index(row.i), rounds.index(row.round)] = row.community_i
    figure = new_figure(figsize=(max(5, 0.35 * len(rounds) + 2), max(3, 0.25 * len(clients) + 1)))
    axes = figure.subplots()
    axes.imshow(grid, aspect="auto", cmap="tab20", interpolation="nearest", vmin=0, vmax=19)
    for (y, x), value in np.ndenumerate(grid):
        if not np.isnan(value):
            axes.text(x, y, str(int(value)), ha="center", va="center", fontsize=6)
    truth = seed_rows.drop_duplicates("i").set_index("i")["true_group_i"]
    axes.set_yticks(range(len(clients)), [f"{c} ({truth[c]})" for c in clients], fontsize=6)
    axes.set_xticks(range(len(rounds)), rounds, fontsize=6)
    axes.set_xlabel("round")
    axes.set_ylabel("client (true group)")
    axes.set_title(f"Communities over rounds (seed {int(seed_rows['seed'].iloc[0])})")
    return save_figure(figure, path)


def plot_similarity(graph: pd.DataFrame, path: Path) -> Path:
    """Heatmap of s_ij at the last round of the first seed."""
    seed_rows = graph[graph["seed"] == graph["seed"].min()]
    last = seed_rows[seed_rows["round"] == seed_rows["round"].max()]
    matrix = last.pivot(index="i", columns="j", values="s_ij")
    figure = new_figure(figsize=(5.5, 4.5))
    axes = figure.subplots()
    image = axes.imshow(matrix.to_numpy(dtype=float), cmap="Reds", vmin=0, vmax=1)
    figure.colorbar(image, ax=axes, label="s_ij")
    axes.set_xticks(range(len(matrix.columns)), matrix.columns, fontsize=6)
    axes.set_yticks(range(len(matrix.index)), matrix.index, fontsize=6)
    axes.set_title(f"Similarity s_ij, round {int(last['round'].max())}")
    return save_figure(figure, path)


@table_reporter("graph")
def report_graph(run_dir: Path, summary: dict) -> None:
    """Add summary['graph']."""
    graph = pd.read_parquet(Path(run_dir) / "graph.parquet")
    if graph.empty:
        return
    nodes = memberships(graph)
    per_seed = {int(seed): seed_figures(rows) for seed, rows in nodes.groupby("seed")}
    keys = next(iter(per_seed.values())).keys()
    summary["graph"] = {
        **{key: mean_std([figures[key] for figures in per_seed.values()]) for key in keys},
        "per_seed": per_seed,
    }


@table_plotter("graph")
def plot_graph(run_dir: Path) -> list[Path]:
    """plots/communities_over_rounds.png (seed 0) and plots/similarity_last.png."""
    graph = pd.read_parquet(Path(run_dir) / "graph.parquet")
    if graph.empty:
        return []
    nodes = memberships(graph)
    plots = Path(run_dir) / "plots"
    first_seed = nodes[nodes["seed"] == nodes["seed"].min()]
    return [
        plot_communities(first_seed, plots / "communities_over_rounds.png"),
        plot_similarity(graph, plots / "similarity_last.png"),
    ]
