"""Reporter of maps.parquet (Sheaf-FMTL): the restriction maps' Frobenius norms over the graph.

Rows: (seed, round, i, j, norm) with norm = ‖P_ij‖_F after the round's map step, one per
directed edge. Adds `summary["maps"]`: the mean norm at the last round, within the clients'
groups (rotation group; a group's clients share a task) and across them, and the number of
directed edges; draws plots/maps_last.png (the N×N heatmap of the paper's Figure 4, seed 0),
plots/maps_over_rounds.png (mean norm within vs across groups per round, band over seeds) and
plots/graph.png (the communication graph, clients coloured by group, sized by model).
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd

from raymtl.metrics.extras import table_plotter, table_reporter
from raymtl.metrics.figures import new_figure, save_figure
from raymtl.metrics.recorder import Recorder


def client_groups(run_dir: Path) -> pd.DataFrame:
    """One row per client: its group and model size (from clients.parquet)."""
    clients = Recorder.load(run_dir).clients()
    columns = ["client", "group", "model_params"]
    return clients[clients["seed"] == clients["seed"].min()].drop_duplicates("client")[columns]


def with_groups(maps: pd.DataFrame, groups: pd.DataFrame) -> pd.DataFrame:
    group_of = groups.set_index("client")["group"]
    same = maps["i"].map(group_of) == maps["j"].map(group_of)
    return maps.assign(link=np.where(same, "within groups", "across groups"))


def plot_heatmap(last: pd.DataFrame, num_clients: int, path: Path) -> Path:
    grid = np.full((num_clients, num_clients), np.nan)
    grid[last["i"].to_numpy(), last["j"].to_numpy()] = last["norm"].to_numpy()
    figure = new_figure(figsize=(6, 5), layout="constrained")
    axes = figure.subplots()
    image = axes.imshow(grid, cmap="viridis")
    figure.colorbar(image, ax=axes, label="‖P_ij‖_F")
    axes.set_xlabel("j")
    axes.set_ylabel("i (owner of P_ij)")
    axes.set_title("Restriction-map norms, last round (blank: no edge)")
    return save_figure(figure, path)


def plot_over_rounds(maps: pd.DataFrame, path: Path) -> Path:
    per_seed = maps.groupby(["link", "round", "seed"])["norm"].mean()
    figure = new_figure(figsize=(6, 4), layout="constrained")
    axes = figure.subplots()
    for link, rows in per_seed.groupby(level="link"):
        curves = rows.groupby(level="round").agg(["mean", "min", "max"])
        (line,) = axes.plot(curves.index, curves["mean"], label=link)
        axes.fill_between(
            curves.index, curves["min"], curves["max"], alpha=0.2, color=line.get_color()
        )
    axes.set_xlabel("round")
    axes.set_ylabel("mean ‖P_ij‖_F")
    axes.set_title("Restriction-map norms over rounds (band: min/max over seeds)")
    axes.legend()
    return save_figure(figure, path)


def plot_graph(last: pd.DataFrame, groups: pd.DataFrame, path: Path) -> Path:
    graph = nx.Graph()
    graph.add_nodes_from(groups["client"])
    graph.add_edges_from(zip(last["i"], last["j"], strict=True))
    sizes = groups.set_index("client")["model_params"].reindex(graph.nodes).fillna(1)
    figure = new_figure(figsize=(6, 5), layout="constrained")
    axes = figure.subplots()
    nx.draw_networkx(
        graph,
        pos=nx.spring_layout(graph, seed=0),
        ax=axes,
        font_size=7,
        node_color=groups.set_index("client")["group"].reindex(graph.nodes).to_numpy(),
        cmap="tab10",
        node_size=(80 + 220 * np.sqrt(sizes / sizes.max())).to_numpy(),
    )
    axes.set_title("Communication graph (colour: group; size: model parameters)")
    axes.set_axis_off()
    return save_figure(figure, path)


@table_reporter("maps")
def report_maps(run_dir: Path, summary: dict) -> None:
    maps = pd.read_parquet(Path(run_dir) / "maps.parquet")
    if maps.empty:
        return
    groups = client_groups(run_dir)
    maps = with_groups(maps, groups)
    last = maps[maps["round"] == maps["round"].max()]
    by_link = last.groupby("link")["norm"].mean()
    summary["maps"] = {
        "norm_last_mean": float(last["norm"].mean()),
        **{f"norm_last_{k.split()[0]}_groups": float(v) for k, v in by_link.items()},
        "directed_edges": int(len(last[last["seed"] == last["seed"].min()])),
    }


@table_plotter("maps")
def plot_maps(run_dir: Path) -> list[Path]:
    maps = pd.read_parquet(Path(run_dir) / "maps.parquet")
    if maps.empty:
        return []
    groups = client_groups(run_dir)
    maps = with_groups(maps, groups)
    last = maps[maps["round"] == maps["round"].max()]
    first_seed = last[last["seed"] == last["seed"].min()]
    plots = Path(run_dir) / "plots"
    return [
        plot_heatmap(first_seed, len(groups), plots / "maps_last.png"),
        plot_over_rounds(maps, plots / "maps_over_rounds.png"),
        plot_graph(first_seed, groups, plots / "graph.png"),
    ]
