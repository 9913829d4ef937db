"""Rounds and bits to a target metric, and the peak memory of a run's processes, from
hand-made rounds.parquet and hosts.parquet (no Ray)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rich.console import Console

from raymtl.api.comparison import final_table
from raymtl.metrics import Recorder, results_table, summarize
from raymtl.metrics.costs import format_bytes
from raymtl.metrics.report import format_tflops

NAN = float("nan")


def round_row(seed: int, round_: int, accuracy: float, loss: float, evaluated=True) -> dict:
    """Round r of a seed: cumulative bits 1000·r, 2·r TFLOPs, wall time 2·r seconds."""

    def metric(value: float) -> float:
        return value if evaluated else NAN

    return {
        "seed": seed,
        "round": round_,
        "mean_accuracy": metric(accuracy),
        "worst10_accuracy": metric(accuracy - 0.2),
        "worst20_accuracy": metric(accuracy - 0.1),
        "std_accuracy": metric(0.05),
        "mean_loss": metric(loss),
        "bits_up": 500,
        "bits_down": 500,
        "cum_bits_up": 500 * round_,
        "cum_bits_down": 500 * round_,
        "cum_bits": 1000 * round_,
        "flops": 2e12,
        "cum_flops": 2e12 * round_,
        "wall_time": 2.0 * round_,
    }


def write_run(run_dir: Path, rounds: list[dict], hosts: list[dict] = (), config=None) -> Path:
    recorder = Recorder(run_dir)
    for row in rounds:
        recorder.add_round(row)
    if hosts:
        recorder.add_rows("hosts", list(hosts))
    recorder.flush()
    if config is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


# Seed 0 reaches 0.8 at round 3 (round 4 is not evaluated); seed 1 peaks at 0.75.
SEED0 = [(1, 0.5, 1.2), (2, 0.7, 0.9), (3, 0.85, 0.6), (4, 0.9, 0.5)]
SEED1 = [(1, 0.4, 1.4), (2, 0.6, 1.0), (3, 0.75, 0.8), (4, 0.7, 0.7)]


def two_seed_rows() -> list[dict]:
    rows = []
    for seed, trajectory in ((0, SEED0), (1, SEED1)):
        for round_, accuracy, loss in trajectory:
            rows.append(round_row(seed, round_, accuracy, loss, evaluated=round_ != 4))
    return rows


def target_config(target, metric="mean_accuracy") -> dict:
    return {"metrics": {"target": target, "metric": metric}}


def test_target_reached_at_round_3_with_its_cumulative_bits(tmp_path: Path):
    run_dir = write_run(tmp_path, two_seed_rows(), config=target_config(0.8))
    target = summarize(run_dir, "fedavg")["target"]
    assert target["metric"] == "mean_accuracy" and target["target"] == 0.8
    reached = {"round": 3, "bits": 3000.0, "flops": 6e12, "wall_time": 6.0}
    assert target["per_seed"] == {"0": reached, "1": None}
    assert (target["seeds"], target["seeds_reached"], target["reached"]) == (2, 1, 0.5)
    # Mean ± std over the one seed that reached it.
    assert target["rounds"] == {"mean": 3.0, "std": 0.0}
    assert target["bits"] == {"mean": 3000.0, "std": 0.0}
    assert target["flops"] == {"mean": 6e12, "std": 0.0}
    assert target["wall_time"] == {"mean": 6.0, "std": 0.0}
    assert json.loads((run_dir / "summary.json").read_text())["target"] == target


def test_target_is_the_first_evaluated_round_reaching_it(tmp_path: Path):
    # 0.9 at round 4 is never evaluated (NaN): only evaluated rounds count.
    target = summarize(write_run(tmp_path, two_seed_rows()), "fedavg", target_config(0.7))
    assert target["target"]["per_seed"]["0"]["round"] == 2  # 0.7 >= 0.7
    assert target["target"]["per_seed"]["1"]["round"] == 3
    assert target["target"]["rounds"] == {"mean": 2.5, "std": 0.5}
    assert target["target"]["bits"] == {"mean": 2500.0, "std": 500.0}


def test_target_not_reached_is_null(tmp_path: Path):
    run_dir = write_run(tmp_path, two_seed_rows())
    target = summarize(run_dir, "fedavg", target_config(0.95))["target"]
    assert target["per_seed"] == {"0": None, "1": None}
    assert target["reached"] == 0.0
    assert target["rounds"] is None and target["bits"] is None and target["wall_time"] is None


def test_mean_loss_target_is_reached_from_above(tmp_path: Path):
    run_dir = write_run(tmp_path, two_seed_rows())
    target = summarize(run_dir, "fedavg", target_config(0.9, "mean_loss"))["target"]
    # Seed 0: loss 0.9 at round 2 (<= 0.9); seed 1: 0.8 at round 3.
    assert target["per_seed"]["0"] == {
        "round": 2,
        "bits": 2000.0,
        "flops": 4e12,
        "wall_time": 4.0,
    }
    assert target["per_seed"]["1"]["round"] == 3
    assert target["reached"] == 1.0


def test_worst_metric_target(tmp_path: Path):
    run_dir = write_run(tmp_path, two_seed_rows())
    target = summarize(run_dir, "fedavg", target_config(0.6, "worst10_accuracy"))["target"]
    reached = {"round": 3, "bits": 3000.0, "flops": 6e12, "wall_time": 6.0}
    assert target["per_seed"] == {"0": reached, "1": None}


def test_no_target_no_target_key(tmp_path: Path):
    summary = summarize(write_run(tmp_path, two_seed_rows()), "fedavg", {})
    assert "target" not in summary
    assert "peak_memory" not in summary  # no hosts.parquet


def host_rows() -> list[dict]:
    """Seed 0: 1.0 GB + 0.5 GB; seed 1: 1.2 GB + 0.6 GB (bytes)."""
    peaks = {(0, "client-0"): 1.0e9, (0, "server"): 0.5e9}
    peaks |= {(1, "client-0"): 1.2e9, (1, "server"): 0.6e9}
    return [
        {"seed": seed, "round": 4, "host": host, "peak_rss": int(peak)}
        for (seed, host), peak in peaks.items()
    ]


def test_peak_memory_sums_the_hosts_of_a_seed(tmp_path: Path):
    run_dir = write_run(tmp_path, two_seed_rows(), host_rows())
    memory = summarize(run_dir, "fedavg", {"runtime": {"executor": "ray"}})["peak_memory"]
    assert memory["one_process"] is False
    assert memory["per_seed"]["0"] == {
        "total_bytes": 1.5e9,
        "largest_host_bytes": 1.0e9,
        "hosts": 2,
    }
    assert memory["total_bytes"]["mean"] == pytest.approx(1.65e9)
    assert memory["total_bytes"]["std"] == pytest.approx(0.15e9)
    assert memory["largest_host_bytes"]["mean"] == pytest.approx(1.1e9)


def test_peak_memory_of_an_inline_run_counts_its_one_process_once(tmp_path: Path):
    run_dir = write_run(tmp_path, two_seed_rows(), host_rows())
    memory = summarize(run_dir, "fedavg", {"runtime": {"executor": "inline"}})["peak_memory"]
    assert memory["one_process"] is True
    assert memory["total_bytes"]["mean"] == pytest.approx(1.1e9)  # the largest, not a sum


def test_format_bytes():
    assert format_bytes(2.5e9) == "2.50 GB"
    assert format_bytes(3.4e8) == "340 MB"
    assert format_bytes(NAN) == "-"


def render(table) -> str:
    console = Console(record=True, width=220)
    console.print(table)
    return console.export_text()


def test_table_and_csv_columns(tmp_path: Path):
    config = {"metrics": {"target": 0.8}, "runtime": {"executor": "ray"}}
    reached = summarize(write_run(tmp_path / "a", two_seed_rows(), host_rows(), config), "a")
    missed = {**config, "metrics": {"target": 0.99}}
    not_reached = summarize(write_run(tmp_path / "b", two_seed_rows(), (), missed), "b")
    text = render(results_table([reached, not_reached], title="Results"))
    assert "Peak mem" in text and "1.65 GB" in text
    assert "Rounds to target" in text and "Bits to target" in text
    assert "3.0±0.0 (1/2 seeds)" in text and "3.0 Kb (1/2 seeds)" in text
    assert "not reached" in text
    assert "TFLOPs" in text and "TFLOPs to target" in text
    assert format_tflops(8e12) == "8" and format_tflops(float("nan")) == "-"
    assert "│      8 │" in text  # 4 rounds of 2 TFLOPs, the run's total, in its column
    assert "6 (1/2 seeds)" in text  # 3 rounds of 2 TFLOPs to the target
    assert "target: mean_accuracy >= 0.8" in text
    table = final_table([reached, not_reached]).set_index("experiment")
    assert table.loc["a", "peak_memory_bytes"] == pytest.approx(1.65e9)
    assert math.isnan(table.loc["b", "peak_memory_bytes"])
    assert table.loc["a", "target_reached"] == 0.5
    assert table.loc["a", "target_rounds_mean"] == 3.0
    assert table.loc["a", "target_bits_mean"] == 3000.0
    assert table.loc["a", "target_flops_mean"] == 6e12
    assert table.loc["a", "total_flops_mean"] == 8e12
    assert table.loc["b", "target_reached"] == 0.0
    figures = ["target_rounds_mean", "target_bits_mean", "target_flops_mean"]
    assert table.loc[["b"], figures].isna().all(axis=None)


def test_csv_has_no_target_columns_without_a_target(tmp_path: Path):
    summary = summarize(write_run(tmp_path, two_seed_rows()), "fedavg", {})
    table = final_table([summary])
    assert "target_reached" not in table.columns
    assert pd.isna(table.loc[0, "peak_memory_bytes"])
