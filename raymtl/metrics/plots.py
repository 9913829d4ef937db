"""PNG plots of one run and comparisons across runs, drawn from the Parquet metric tables.

`plot_run` draws the run's own figures, the per-task ones and those of its algorithm's tables
(`raymtl.metrics.tables`); nothing else in the package draws a run's plots, so a run with
`output.plots: false` (which never calls it) has none.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from raymtl.metrics.figures import (
    add_legend_if_labelled,
    draw_band,
    new_figure,
    save_figure,
    scale_bits_axis,
)
from raymtl.metrics.recorder import Recorder
from raymtl.metrics.statistics import evaluated_rounds
from raymtl.metrics.tables import plot_extra_tables
from raymtl.metrics.tasks import plot_task_comparison

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# Runs without communication get a single point here (a bits axis holding them is log: its
# other values are far above 1).
NO_COMMUNICATION_X = 1.0


def curves_by_round(rounds: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per round: mean/min/max of ``column`` across seeds plus mean cumulative bits."""
    evaluated = evaluated_rounds(rounds).dropna(subset=[column])
    grouped = evaluated.groupby("round")
    curves = grouped[column].agg(["mean", "min", "max"])
    curves["cum_bits"] = grouped["cum_bits"].mean()
    return curves.sort_index()


def draw_accuracy_vs_round(axes: Axes, curves: pd.DataFrame, label: str) -> None:
    """Accuracy against communication round."""
    draw_band(axes, curves.index.to_numpy(), curves, label)
    axes.set_xlabel("round")
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("accuracy")


def draw_accuracy_vs_bits(axes: Axes, curves: pd.DataFrame, label: str) -> list[float]:
    """Accuracy against cumulative bits; returns the x values drawn, for `scale_bits_axis`
    once every curve is on the axes (log only where they span more than 10x).

    Zero-bit points are left out (a log axis cannot place them); if every point is zero
    (e.g. Local training) the final accuracy is drawn as a single marker at x=1, labelled as
    such.
    """
    axes.set_xlabel("cumulative transmitted bits")
    axes.set_ylabel("accuracy")
    with_bits = curves[curves["cum_bits"] > 0]
    if not with_bits.empty:
        draw_band(axes, with_bits["cum_bits"].to_numpy(), with_bits, label)
        return with_bits["cum_bits"].tolist()
    if not curves.empty:
        final_accuracy = curves["mean"].iloc[-1]
        axes.plot([NO_COMMUNICATION_X], [final_accuracy], "o", label=f"{label} (no bits sent)")
        return [NO_COMMUNICATION_X]
    return []


def plot_accuracy_vs_round(rounds: pd.DataFrame, path: Path) -> Path:
    """Mean and worst-10% accuracy per round across seeds."""
    figure = new_figure(figsize=(6, 4))
    axes = figure.subplots()
    draw_accuracy_vs_round(axes, curves_by_round(rounds, "mean_accuracy"), "mean")
    draw_accuracy_vs_round(axes, curves_by_round(rounds, "worst10_accuracy"), "worst 10%")
    axes.set_title("Accuracy vs round (band: min/max over seeds)")
    add_legend_if_labelled(axes)
    return save_figure(figure, path)


def plot_accuracy_vs_bits(rounds: pd.DataFrame, path: Path) -> Path:
    """Mean and worst-10% accuracy against cumulative bits."""
    figure = new_figure(figsize=(6, 4))
    axes = figure.subplots()
    drawn = draw_accuracy_vs_bits(axes, curves_by_round(rounds, "mean_accuracy"), "mean")
    drawn += draw_accuracy_vs_bits(axes, curves_by_round(rounds, "worst10_accuracy"), "worst 10%")
    scale_bits_axis(axes, "x", drawn)
    axes.set_title("Accuracy vs cumulative bits")
    add_legend_if_labelled(axes)
    return save_figure(figure, path)


def final_client_accuracies(clients: pd.DataFrame) -> dict[int, pd.Series]:
    """Per seed, the client accuracies at that seed's last evaluated round."""
    evaluated = clients.dropna(subset=["accuracy"])
    accuracies_by_seed = {}
    for seed, seed_rows in evaluated.groupby("seed"):
        last_round = seed_rows["round"].max()
        accuracies_by_seed[int(seed)] = seed_rows.loc[seed_rows["round"] == last_round, "accuracy"]
    return accuracies_by_seed


def plot_client_accuracy_distribution(clients: pd.DataFrame, path: Path) -> Path:
    """Box plot (with the points) of final per-client accuracy, one box per seed."""
    figure = new_figure(figsize=(6, 4))
    axes = figure.subplots()
    accuracies_by_seed = final_client_accuracies(clients)
    if accuracies_by_seed:
        labels = [f"seed {seed}" for seed in accuracies_by_seed]
        data = [series.to_numpy() for series in accuracies_by_seed.values()]
        axes.boxplot(data)
        # set_xticks rather than boxplot's label keyword, which was renamed in matplotlib 3.9.
        axes.set_xticks(range(1, len(labels) + 1), labels)
        for position, values in enumerate(data, start=1):
            axes.plot([position] * len(values), values, ".", alpha=0.4, color="gray")
    else:
        axes.text(0.5, 0.5, "no per-client evaluations recorded", ha="center", va="center")
    axes.set_ylabel("final client accuracy")
    axes.set_title("Per-client final accuracy")
    return save_figure(figure, path)


def plot_run(run_dir: Path) -> list[Path]:
    """Draw the run's plots into ``run_dir/plots`` and return their paths."""
    run_dir = Path(run_dir)
    recorder = Recorder.load(run_dir)
    rounds, clients = recorder.rounds(), recorder.clients()
    out_dir = run_dir / "plots"
    paths = [
        plot_accuracy_vs_round(rounds, out_dir / "accuracy_vs_round.png"),
        plot_accuracy_vs_bits(rounds, out_dir / "accuracy_vs_bits.png"),
        plot_client_accuracy_distribution(clients, out_dir / "client_accuracy_distribution.png"),
    ]
    per_task = plot_task_comparison({run_dir.name: clients}, out_dir / "tasks.png")
    return paths + ([per_task] if per_task else []) + plot_extra_tables(run_dir)


def plot_comparison_metric(
    rounds_by_algorithm: dict[str, pd.DataFrame], column: str, path: Path
) -> Path:
    """Side by side: ``column`` vs round | ``column`` vs cumulative bits, one line per algorithm."""
    figure = new_figure(figsize=(12, 4.5))
    round_axes, bits_axes = figure.subplots(1, 2)
    drawn = []
    for algorithm, rounds in rounds_by_algorithm.items():
        curves = curves_by_round(rounds, column)
        draw_accuracy_vs_round(round_axes, curves, algorithm)
        drawn += draw_accuracy_vs_bits(bits_axes, curves, algorithm)
    scale_bits_axis(bits_axes, "x", drawn)
    round_axes.set_title(f"{column} vs round")
    bits_axes.set_title(f"{column} vs cumulative bits")
    for axes in (round_axes, bits_axes):
        axes.set_ylabel(column)
        add_legend_if_labelled(axes)
    return save_figure(figure, path)


def plot_bits_per_round(rounds_by_algorithm: dict[str, pd.DataFrame], path: Path) -> Path:
    """Bits sent per round (up + down, mean over seeds), one line per algorithm; a log axis
    only where the arms span more than 10x (`scale_bits_axis`), else linear from 0."""
    figure = new_figure(figsize=(6, 4), layout="constrained")
    axes = figure.subplots()
    drawn = []
    for algorithm, rounds in rounds_by_algorithm.items():
        per_round = (rounds["bits_up"] + rounds["bits_down"]).groupby(rounds["round"]).mean()
        if (per_round > 0).any():
            axes.plot(per_round.index, per_round.to_numpy(), marker=".", label=algorithm)
            drawn += per_round.tolist()
    scale_bits_axis(axes, "y", drawn)
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("round")
    axes.set_ylabel("bits per round (up + down)")
    axes.set_title("Communication per round (algorithms that send nothing are absent)")
    add_legend_if_labelled(axes)
    return save_figure(figure, path)


def plot_comparison(runs: dict[str, Path], out_dir: Path) -> list[Path]:
    """Compare algorithms (name -> run dir): mean and worst-10% accuracy figures in ``out_dir``."""
    out_dir = Path(out_dir)
    rounds_by_algorithm = {name: Recorder.load(run_dir).rounds() for name, run_dir in runs.items()}
    paths = [
        plot_comparison_metric(
            rounds_by_algorithm, "mean_accuracy", out_dir / "comparison_mean_accuracy.png"
        ),
        plot_comparison_metric(
            rounds_by_algorithm, "worst10_accuracy", out_dir / "comparison_worst10_accuracy.png"
        ),
    ]
    paths.append(
        plot_bits_per_round(rounds_by_algorithm, out_dir / "comparison_bits_per_round.png")
    )
    clients = {name: Recorder.load(run_dir).clients() for name, run_dir in runs.items()}
    per_task = plot_task_comparison(clients, out_dir / "comparison_tasks.png")
    return paths + ([per_task] if per_task else [])
