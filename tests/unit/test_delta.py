"""Δ% vs Local (raymtl.metrics.delta) on tiny hand-computed runs.

Two seeds, three clients: clients 0 and 1 solve a classification task ("cls", accuracy),
client 2 a regression task ("reg", MSE, lower is better). Round 0 is evaluated but earlier,
round 1 is the last evaluated round (the one used), round 2 has no evaluation (NaN loss).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from rich.console import Console

from raymtl.metrics.delta import (
    arm_deltas,
    client_finals,
    clients_table,
    delta_summary,
    delta_table,
    local_reference,
    record_deltas,
    relative_gains,
)
from raymtl.metrics.recorder import Recorder

TASKS = {0: "cls", 1: "cls", 2: "reg"}
# (seed, client) -> figure at round 1: accuracy for clients 0 and 1, MSE for client 2.
LOCAL = {(0, 0): 0.5, (0, 1): 0.8, (0, 2): 2.0, (1, 0): 0.4, (1, 1): 0.5, (1, 2): 4.0}
ARM = {(0, 0): 0.6, (0, 1): 0.6, (0, 2): 1.0, (1, 0): 0.5, (1, 1): 0.6, (1, 2): 5.0}
# Gains in %: accuracy 100·(arm − local)/local, MSE 100·(local − arm)/local.
GAINS = {(0, 0): 20.0, (0, 1): -25.0, (0, 2): 50.0, (1, 0): 25.0, (1, 1): 20.0, (1, 2): -25.0}


def client_rows(finals: dict[tuple[int, int], float]) -> list[dict]:
    """Recorder-style rows; round 0 and the unevaluated round 2 carry decoy figures."""
    rows = []
    for (seed, client), value in finals.items():
        task = TASKS[client]
        for round_, loss, figure in ((0, 1.0, 0.1), (1, 0.5, value), (2, math.nan, 0.99)):
            rows.append(
                {
                    "seed": seed,
                    "round": round_,
                    "client": client,
                    "task_name": task,
                    "loss": loss,
                    "accuracy": figure if task == "cls" else math.nan,
                    "f1": math.nan,
                    "mse": figure if task == "reg" else math.nan,
                }
            )
    return rows


def test_client_finals_take_last_evaluated_round_and_task_metric():
    finals = client_finals(pd.DataFrame(client_rows(LOCAL)))
    assert list(finals.columns) == ["seed", "client", "task_name", "metric", "value"]
    assert len(finals) == 6
    by_key = finals.set_index(["seed", "client"])
    for key, value in LOCAL.items():
        assert by_key.loc[key, "value"] == pytest.approx(value)
        assert by_key.loc[key, "task_name"] == TASKS[key[1]]
        assert by_key.loc[key, "metric"] == ("accuracy" if key[1] < 2 else "mse")


def gains() -> pd.DataFrame:
    local = client_finals(pd.DataFrame(client_rows(LOCAL)))
    return relative_gains(client_finals(pd.DataFrame(client_rows(ARM))), local)


def test_relative_gains_sign_follows_metric_direction():
    table = gains()
    assert list(table.columns) == [
        "seed",
        "client",
        "task_name",
        "metric",
        "reference",
        "value",
        "gain",
    ]
    by_key = table.set_index(["seed", "client"])
    for key, gain in GAINS.items():
        assert by_key.loc[key, "gain"] == pytest.approx(gain)
        assert by_key.loc[key, "reference"] == pytest.approx(LOCAL[key])
        assert by_key.loc[key, "value"] == pytest.approx(ARM[key])
    assert by_key.loc[(0, 2), "gain"] > 0  # MSE halved: an improvement
    assert by_key.loc[(1, 2), "gain"] < 0  # MSE up from 4 to 5: a loss


def test_delta_summary_over_seeds_tasks_and_clients():
    summary = delta_summary(gains())
    # Per seed, mean over clients: seed 0 (20 − 25 + 50)/3 = 15, seed 1 (25 + 20 − 25)/3 = 20/3.
    assert summary["delta_percent"]["mean"] == pytest.approx((15 + 20 / 3) / 2)
    assert summary["delta_percent"]["std"] == pytest.approx((15 - 20 / 3) / 2)  # population
    # cls: seed 0 (20 − 25)/2 = −2.5, seed 1 (25 + 20)/2 = 22.5; reg: 50 and −25.
    assert summary["per_task"]["cls"] == pytest.approx({"mean": 10.0, "std": 12.5})
    assert summary["per_task"]["reg"] == pytest.approx({"mean": 12.5, "std": 37.5})
    clients = {row["client"]: row for row in summary["per_client"]}
    assert clients[0] == pytest.approx(
        {
            "client": 0,
            "task_name": "cls",
            "metric": "accuracy",
            "reference": 0.45,
            "value": 0.55,
            "gain": 22.5,
        }
    )
    assert clients[1]["gain"] == pytest.approx(-2.5)
    assert clients[2]["metric"] == "mse" and clients[2]["gain"] == pytest.approx(12.5)
    json.dumps(summary)  # plain Python types


def test_zero_reference_has_no_relative_gain():
    local = client_finals(pd.DataFrame(client_rows({**LOCAL, (0, 0): 0.0})))
    table = relative_gains(client_finals(pd.DataFrame(client_rows(ARM))), local)
    assert math.isnan(table.set_index(["seed", "client"]).loc[(0, 0), "gain"])
    # Seed 0's mean is over the two clients left: (−25 + 50)/2.
    assert delta_summary(table)["per_task"]["reg"]["mean"] == pytest.approx(12.5)


def test_local_reference_needs_exactly_one_local_arm():
    def config(name, algorithm):
        return SimpleNamespace(name=name, algorithm=SimpleNamespace(name=algorithm))

    assert local_reference([config("a", "fedavg"), config("b", "local")]) == "b"
    assert local_reference([config("a", "fedavg")]) is None
    assert local_reference([config("a", "local"), config("b", "local")]) is None


def test_arm_deltas_reference_gets_zero():
    clients = {name: pd.DataFrame(client_rows(v)) for name, v in (("local", LOCAL), ("mtl", ARM))}
    deltas = arm_deltas(clients, "local")
    assert deltas["local"]["delta_percent"] == {"mean": 0.0, "std": 0.0}
    assert deltas["mtl"]["delta_percent"]["mean"] == pytest.approx((15 + 20 / 3) / 2)
    table = clients_table(deltas)
    assert list(table.columns) == ["arm", "client", "task_name", "metric", "value", "gain"]
    assert len(table) == 6


def write_run(run_dir: Path, finals: dict[tuple[int, int], float]) -> Path:
    recorder = Recorder(run_dir)
    recorder.add_clients(client_rows(finals))
    recorder.flush()
    (run_dir / "summary.json").write_text(json.dumps({"algorithm": run_dir.name, "final": {}}))
    return run_dir


def test_record_deltas_writes_run_summaries_and_client_table(tmp_path: Path):
    runs = {"local": write_run(tmp_path / "local", LOCAL), "mtl": write_run(tmp_path / "mtl", ARM)}
    deltas = record_deltas(runs, "local", tmp_path)
    for name, run_dir in runs.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["algorithm"] == name  # the run's own keys are kept
        assert summary["delta_vs_local"] == deltas[name]
    assert deltas["mtl"]["per_task"]["reg"] == pytest.approx({"mean": 12.5, "std": 37.5})
    table = pd.read_csv(tmp_path / "table_clients.csv")
    assert list(table.columns) == ["arm", "client", "task_name", "metric", "value", "gain"]
    mtl = table[table["arm"] == "mtl"].set_index("client")
    assert mtl.loc[0, "gain"] == pytest.approx(22.5)
    assert mtl.loc[2, "metric"] == "mse" and mtl.loc[2, "value"] == pytest.approx(3.0)
    assert (table[table["arm"] == "local"]["gain"] == 0).all()
    summaries = [{"algorithm": name, "delta_vs_local": delta} for name, delta in deltas.items()]
    console = Console(record=True, width=160)
    console.print(delta_table(summaries))
    text = console.export_text()
    assert "Δ% vs local" in text and "+10.8±4.2" in text and "+12.5±37.5" in text
