"""Δ%: the mean relative gain of an experiment over Local training, across clients (FedMuscle).

Per client, the gain is the relative change of its task's primary metric at the seed's last
evaluated round against the same client trained alone: 100·(arm − local)/|local| for metrics
where higher is better, 100·(local − arm)/|local| for errors (MSE), so a positive gain is
always an improvement. Δ% is the mean gain over clients, per seed, then mean ± std over seeds.
A client whose Local figure is 0 has no relative gain (NaN, left out of the means).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from rich.table import Table

from raymtl.metrics.recorder import Recorder
from raymtl.metrics.statistics import mean_and_std, without_nan
from raymtl.metrics.tasks import HIGHER_IS_BETTER, primary_metric

FINAL_COLUMNS = ["seed", "client", "task_name", "metric", "value"]
GAIN_COLUMNS = ["seed", "client", "task_name", "metric", "reference", "value", "gain"]
CLIENT_TABLE_COLUMNS = ["arm", "client", "task_name", "metric", "value", "gain"]
SUMMARY_KEY = "delta_vs_local"


def client_finals(clients: pd.DataFrame) -> pd.DataFrame:
    """Per (seed, client): its task, the task's primary metric and that metric's value at the
    seed's last evaluated round (rows whose loss is not NaN)."""
    evaluated = clients.dropna(subset=["loss"]).copy()
    if evaluated.empty:
        return pd.DataFrame(columns=FINAL_COLUMNS)
    if "task_name" not in evaluated:  # runs written before tasks existed: one task
        evaluated["task_name"] = None
    evaluated["task_name"] = evaluated["task_name"].fillna("")
    last = evaluated[evaluated["round"] == evaluated.groupby("seed")["round"].transform("max")]
    parts = []
    for task, rows in last.groupby("task_name", sort=False):
        metric = primary_metric(evaluated[evaluated["task_name"] == task])
        parts.append(
            pd.DataFrame(
                {
                    "seed": rows["seed"].astype("int64"),
                    "client": rows["client"].astype("int64"),
                    "task_name": str(task),
                    "metric": metric,
                    "value": rows[metric].astype(float),
                }
            )
        )
    finals = pd.concat(parts, ignore_index=True)
    return finals.sort_values(["seed", "client"]).reset_index(drop=True)


def relative_gains(arm: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Per (seed, client) present in both: the arm's gain in % over the reference (Local).

    Task and metric come from the reference; a client whose arm reports another metric, or
    whose reference is 0, gets a NaN gain.
    """
    joined = reference.rename(columns={"value": "reference"}).merge(
        arm[["seed", "client", "metric", "value"]].rename(columns={"metric": "arm_metric"}),
        on=["seed", "client"],
        how="inner",
    )
    if joined.empty:
        return pd.DataFrame(columns=GAIN_COLUMNS)
    joined["value"] = joined["value"].where(joined["arm_metric"] == joined["metric"])
    sign = np.where(joined["metric"].isin(HIGHER_IS_BETTER), 1.0, -1.0)
    scale = joined["reference"].abs().where(joined["reference"] != 0)
    joined["gain"] = 100.0 * sign * (joined["value"] - joined["reference"]) / scale
    return joined[GAIN_COLUMNS].sort_values(["seed", "client"]).reset_index(drop=True)


def seed_means(gains: pd.DataFrame) -> list[float]:
    """Per seed, the mean gain over its clients (seeds without any finite gain left out)."""
    return gains.groupby("seed")["gain"].mean().dropna().tolist()


def delta_summary(gains: pd.DataFrame) -> dict:
    """Δ% (mean ± std over seeds of the mean gain across clients), per task, and per client
    (reference, value and gain, each the mean over seeds)."""
    per_task = {
        str(task): mean_and_std(seed_means(rows))
        for task, rows in gains.groupby("task_name", sort=False)
    }
    per_client = []
    columns = ["reference", "value", "gain"]
    means = gains.groupby(["client", "task_name", "metric"])[columns].mean().reset_index()
    for row in means.itertuples(index=False):
        per_client.append(
            {
                "client": int(row.client),
                "task_name": str(row.task_name),
                "metric": str(row.metric),
                **{column: float(getattr(row, column)) for column in columns},
            }
        )
    return {
        "delta_percent": mean_and_std(seed_means(gains)),
        "per_task": per_task,
        "per_client": per_client,
    }


def local_reference(configs: list) -> str | None:
    """The name of the one experiment whose algorithm is Local (None: none, or several)."""
    names = [cfg.name for cfg in configs if cfg.algorithm.name == "local"]
    return names[0] if len(names) == 1 else None


def arm_deltas(clients_by_arm: dict[str, pd.DataFrame], reference: str) -> dict[str, dict]:
    """Arm name -> its `delta_summary` against the reference arm (which gets 0)."""
    reference_finals = client_finals(clients_by_arm[reference])
    return {
        arm: delta_summary(relative_gains(client_finals(clients), reference_finals))
        for arm, clients in clients_by_arm.items()
    }


def clients_table(deltas: dict[str, dict]) -> pd.DataFrame:
    """One row per (arm, client): its metric's value and its gain, each the mean over seeds."""
    rows = [
        {"arm": arm, **{key: client[key] for key in CLIENT_TABLE_COLUMNS[1:]}}
        for arm, delta in deltas.items()
        for client in delta["per_client"]
    ]
    return pd.DataFrame(rows, columns=CLIENT_TABLE_COLUMNS)


def record_deltas(runs: dict[str, Path], reference: str, out: Path) -> dict[str, dict]:
    """Each run's Δ% vs the reference run: added to its summary.json under `SUMMARY_KEY`, and
    per client to `<out>/table_clients.csv`. Returns arm name -> delta summary."""
    clients = {arm: Recorder.load(run_dir).clients() for arm, run_dir in runs.items()}
    deltas = arm_deltas(clients, reference)
    for arm, run_dir in runs.items():
        path = Path(run_dir) / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps(without_nan({**summary, SUMMARY_KEY: deltas[arm]}), indent=2))
    clients_table(deltas).to_csv(Path(out) / "table_clients.csv", index=False)
    return deltas


def format_gain(stat: dict[str, float]) -> str:
    """'+mean±std' of a gain in %."""
    if stat["mean"] is None or math.isnan(stat["mean"]):
        return "-"
    return f"{stat['mean']:+.1f}±{stat['std']:.1f}"


def delta_table(summaries: list[dict]) -> Table:
    """One row per experiment that has a Δ%: overall and per task, mean ± std over seeds."""
    table = Table(
        title="Δ% vs local (mean relative gain over Local across clients)", title_justify="left"
    )
    table.add_column("Experiment", style="bold", no_wrap=True)
    table.add_column("Δ% vs local", justify="right", no_wrap=True)
    with_delta = [summary for summary in summaries if SUMMARY_KEY in summary]
    tasks = list(
        dict.fromkeys(task for s in with_delta for task in s[SUMMARY_KEY]["per_task"] if task)
    )
    tasks = tasks if len(tasks) > 1 else []  # one task: its column is the overall one
    for task in tasks:
        table.add_column(f"Δ% {task}", justify="right", no_wrap=True)
    for summary in with_delta:
        delta = summary[SUMMARY_KEY]
        per_task = [
            format_gain(delta["per_task"][task]) if task in delta["per_task"] else ""
            for task in tasks
        ]
        table.add_row(summary["algorithm"], format_gain(delta["delta_percent"]), *per_task)
    return table
