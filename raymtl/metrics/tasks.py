"""Per-task figures: a federation whose clients solve different tasks is judged per task.

Each task has its own metrics (clients.parquet: accuracy for classification, micro
precision/recall/F1 for multi-label attributes, MSE/MAE for regression). Per seed, a task's
figure is the mean over its clients at the seed's last evaluated round; summary.json gives
mean ± std over seeds under "tasks".
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from rich.table import Table

from raymtl.metrics.figures import (
    add_legend_if_labelled,
    draw_band,
    new_figure,
    save_figure,
    scale_bits_axis,
)
from raymtl.metrics.statistics import mean_and_std

TASK_METRICS = ("accuracy", "precision", "recall", "f1", "mse", "mae")
# The figure a task is judged by: the first of these its clients report (see tasks.spec).
PRIMARY = ("accuracy", "f1", "mse")
HIGHER_IS_BETTER = ("accuracy", "precision", "recall", "f1")


def has_tasks(clients: pd.DataFrame) -> bool:
    """True when the run is worth reading per task: several tasks, or a task that is not
    classification (one classification task is the run's own accuracy figures)."""
    if "task_name" not in clients or not clients["task_name"].notna().any():
        return False  # runs written before tasks existed
    other_metrics = any(clients[m].notna().any() for m in ("f1", "mse") if m in clients)
    return clients["task_name"].nunique() > 1 or other_metrics


def metrics_of(rows: pd.DataFrame) -> list[str]:
    """The loss and the metrics the task reports (non-null columns)."""
    return ["loss", *(m for m in TASK_METRICS if m in rows and rows[m].notna().any())]


def primary_metric(rows: pd.DataFrame) -> str:
    reported = metrics_of(rows)
    return next((m for m in PRIMARY if m in reported), "loss")


def task_curves(clients: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per round: mean over the task's clients, then mean/min/max over seeds."""
    per_seed = clients.groupby(["round", "seed"])[[metric, "bits_up", "bits_down"]].agg(
        {metric: "mean", "bits_up": "sum", "bits_down": "sum"}
    )
    per_seed["bits"] = per_seed["bits_up"] + per_seed["bits_down"]
    per_seed["cum_bits"] = per_seed["bits"].groupby(level="seed").cumsum()
    grouped = per_seed.groupby(level="round")
    curves = grouped[metric].agg(["mean", "min", "max"])
    curves["cum_bits"] = grouped["cum_bits"].mean()
    return curves.sort_index()


def task_summary(clients: pd.DataFrame) -> dict:
    """task name -> {clients, metric (primary), final: {metric: {mean, std}}} over seeds."""
    summary = {}
    evaluated = clients.dropna(subset=["loss"])
    for name, rows in evaluated.groupby("task_name", sort=False):
        last = rows[rows["round"] == rows.groupby("seed")["round"].transform("max")]
        per_seed = last.groupby("seed")[metrics_of(rows)].mean()
        summary[str(name)] = {
            "clients": int(last.groupby("seed")["client"].nunique().max()),
            "metric": primary_metric(rows),
            "final": {m: mean_and_std(per_seed[m].tolist()) for m in per_seed.columns},
        }
    return summary


def plot_task_comparison(clients_by_run: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """One row per task: its metric vs round | vs bits the task's clients sent and received."""
    tasks = sorted({t for c in clients_by_run.values() if has_tasks(c) for t in c["task_name"]})
    if not tasks:
        return None
    figure = new_figure(figsize=(12, 4 * len(tasks)), layout="constrained")
    axes_rows = figure.subplots(len(tasks), 2, squeeze=False)
    for (round_axes, bits_axes), task in zip(axes_rows, tasks, strict=True):
        drawn = []
        for label, clients in clients_by_run.items():
            rows = clients[clients["task_name"] == task].dropna(subset=["loss"])
            if rows.empty:
                continue
            metric = primary_metric(rows)
            curves = task_curves(rows, metric)
            draw_band(round_axes, curves.index.to_numpy(), curves, label)
            with_bits = curves[curves["cum_bits"] > 0]
            if not with_bits.empty:
                draw_band(bits_axes, with_bits["cum_bits"].to_numpy(), with_bits, label)
                drawn += with_bits["cum_bits"].tolist()
            for axes in (round_axes, bits_axes):
                axes.set_ylabel(
                    metric + ("" if metric in HIGHER_IS_BETTER else " (lower is better)")
                )
                if metric not in HIGHER_IS_BETTER:  # errors span decades when a run diverges
                    axes.set_yscale("log")
        round_axes.set_title(f"task {task}: vs round")
        round_axes.set_xlabel("round")
        bits_axes.set_title(f"task {task}: vs its clients' bits (sent + received; none: absent)")
        scale_bits_axis(bits_axes, "x", drawn)
        bits_axes.set_xlabel("cumulative bits")
        for axes in (round_axes, bits_axes):
            add_legend_if_labelled(axes)
    return save_figure(figure, path)


def task_table(summaries: list[dict], title: str) -> Table:
    """One row per (experiment, task): loss and each metric the task reports, mean ± std over
    seeds; blank where a metric does not apply to the task."""
    tasks = [figures for summary in summaries for figures in summary.get("tasks", {}).values()]
    reported = [m for m in TASK_METRICS if any(m in figures["final"] for figures in tasks)]
    table = Table(title=title, title_justify="left")
    table.add_column("Experiment", no_wrap=True)
    table.add_column("Task", no_wrap=True)
    for header in ("N", "Loss", *reported):
        table.add_column(header, justify="right", no_wrap=True)
    labels = short_labels([summary["algorithm"] for summary in summaries])
    for summary, label in zip(summaries, labels, strict=True):
        for task, figures in summary.get("tasks", {}).items():
            final = figures["final"]
            cells = [format_figure(final, m) for m in ("loss", *reported)]
            table.add_row(label, task, str(figures["clients"]), *cells)
    return table


def format_figure(final: dict, metric: str) -> str:
    """'mean±std' of one of a task's figures; blank where the task does not report it."""
    if metric not in final:
        return ""
    if final[metric]["mean"] is None:  # JSON's null: no seed has the figure
        return "-"
    return f"{final[metric]['mean']:.3g}±{final[metric]['std']:.1g}"


def short_labels(names: list[str]) -> list[str]:
    """Names without the prefix they all share up to a '-' (compare's '<file>-<value>')."""
    prefix = os.path.commonprefix(names) if len(names) > 1 else ""
    cut = prefix.rfind("-") + 1
    return [name[cut:] or name for name in names]
