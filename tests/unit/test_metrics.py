"""Unit tests for raymtl.metrics: fairness stats, Parquet recorder, summaries, table, plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from raymtl.metrics import (
    Recorder,
    fairness_stats,
    plot_comparison,
    plot_run,
    report,
    results_table,
    summarize,
)
from raymtl.metrics.fairness import worst_fraction_count
from raymtl.metrics.report import format_bits

NAN = float("nan")


def test_fairness_stats_on_tenths():
    accuracies = [0.1 * k for k in range(10, 0, -1)]  # unsorted on purpose
    stats = fairness_stats(accuracies)
    mean = 0.55
    std = math.sqrt(sum((0.1 * k - mean) ** 2 for k in range(1, 11)) / 10)  # ddof=0
    assert stats["mean"] == pytest.approx(mean)
    assert stats["worst10"] == pytest.approx(0.1)
    assert stats["worst20"] == pytest.approx(0.15)
    assert stats["std"] == pytest.approx(std)
    assert stats["std"] == pytest.approx(0.28722813232690143)


def test_fairness_stats_rounds_worst_count_up():
    # 5 clients: ceil(0.5) = 1 for worst10, ceil(1.0) = 1 for worst20.
    stats = fairness_stats([0.9, 0.5, 0.7, 0.3, 1.0])
    assert stats["worst10"] == pytest.approx(0.3)
    assert stats["worst20"] == pytest.approx(0.3)
    # 11 clients: ceil(1.1) = 2 and ceil(2.2) = 3.
    stats = fairness_stats([0.0, 0.3, 0.6] + [1.0] * 8)
    assert stats["worst10"] == pytest.approx(0.15)
    assert stats["worst20"] == pytest.approx(0.3)


def test_worst_count_ignores_float_noise():
    assert worst_fraction_count(0.1, 30) == 3  # 0.1 * 30 == 3.0000000000000004
    assert worst_fraction_count(0.2, 1) == 1


def test_fairness_stats_single_and_empty():
    assert fairness_stats([0.4]) == {"mean": 0.4, "worst10": 0.4, "worst20": 0.4, "std": 0.0}
    assert all(math.isnan(value) for value in fairness_stats([]).values())


def client_row(seed: int, round_: int, client: int, accuracy: float) -> dict:
    return {
        "seed": seed,
        "round": round_,
        "client": client,
        "loss": 1.0 - accuracy,
        "accuracy": accuracy,
        "samples": 100,
        "test_samples": 20,
        "group": client % 2,
        "task": client % 2,
        "bits_up": 1000,
        "bits_down": 2000,
    }


def round_row(seed: int, round_: int, accuracy: float, cum_bits: int, evaluated=True) -> dict:
    """A rounds row where worst10 = acc - 0.2, worst20 = acc - 0.1, std = 0.05 when evaluated."""

    def metric(value: float) -> float:
        return value if evaluated else NAN

    return {
        "seed": seed,
        "round": round_,
        "mean_accuracy": metric(accuracy),
        "worst10_accuracy": metric(accuracy - 0.2),
        "worst20_accuracy": metric(accuracy - 0.1),
        "std_accuracy": metric(0.05),
        "mean_loss": metric(1.0 - accuracy),
        "bits_up": cum_bits // 4,
        "bits_down": cum_bits // 4,
        "cum_bits_up": cum_bits // 2,
        "cum_bits_down": cum_bits // 2,
        "cum_bits": cum_bits,
        "wall_time": 1.5 * (round_ + 1),
    }


def message_row(seed: int, round_: int) -> dict:
    return {
        "seed": seed,
        "round": round_,
        "src": "client-0",
        "dst": "server",
        "src_role": "client",
        "dst_role": "server",
        "kind": "model",
        "bits": 512,
    }


def fill_recorder(recorder: Recorder, final_accuracies: dict[int, float], bits_scale=1) -> None:
    """Two seeds' worth of rows: rounds 0..3, evaluation at rounds 0 and 2 only.

    Round 3 is a non-evaluated round, so final accuracies come from round 2 while bits and
    wall time come from round 3.
    """
    for seed, final_accuracy in final_accuracies.items():
        for round_ in range(4):
            evaluated = round_ in (0, 2)
            accuracy = final_accuracy if round_ == 2 else 0.3
            cum_bits = bits_scale * 1_000_000 * (round_ + 1) * (seed + 1)
            recorder.add_round(round_row(seed, round_, accuracy, cum_bits, evaluated))
            recorder.add_messages([message_row(seed, round_)] * 2)
            if evaluated:
                recorder.add_clients(
                    [client_row(seed, round_, c, accuracy + 0.01 * c) for c in range(5)]
                )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    recorder = Recorder(run_dir)
    fill_recorder(recorder, {0: 0.8, 1: 0.6})
    recorder.flush()
    (run_dir / "config.yaml").write_text("algorithm:\n  name: fedavg\n  lr: 0.1\n")
    return run_dir


def test_recorder_round_trip(tmp_path: Path):
    recorder = Recorder(tmp_path / "run")
    fill_recorder(recorder, {0: 0.8, 1: 0.6})
    recorder.flush()
    loaded = Recorder.load(tmp_path / "run")
    pd.testing.assert_frame_equal(loaded.clients(), recorder.clients())
    pd.testing.assert_frame_equal(loaded.rounds(), recorder.rounds())
    pd.testing.assert_frame_equal(loaded.messages(), recorder.messages())
    assert len(loaded.rounds()) == 8
    assert len(loaded.clients()) == 20
    assert loaded.rounds()["mean_accuracy"].isna().sum() == 4
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_recorder_empty_tables_keep_columns(tmp_path: Path):
    Recorder(tmp_path / "empty").flush()
    loaded = Recorder.load(tmp_path / "empty")
    assert list(loaded.clients().columns)[:3] == ["seed", "round", "client"]
    assert "cum_bits" in loaded.rounds().columns
    assert "dst_role" in loaded.messages().columns
    assert loaded.rounds().empty
    assert Recorder.load(tmp_path / "missing").messages().empty


def test_recorder_truncate_after(run_dir: Path):
    recorder = Recorder.load(run_dir)
    seed1_rounds = len(recorder.rounds().query("seed == 1"))
    recorder.truncate_after(seed=0, round=1)
    rounds = recorder.rounds()
    # Seed 0 keeps rounds 0-1; the other seed's rows are untouched.
    assert rounds.query("seed == 0")["round"].tolist() == [0, 1]
    assert len(rounds.query("seed == 1")) == seed1_rounds
    assert recorder.clients().query("seed == 0")["round"].tolist() == [0] * 5
    # Appending after truncation and flushing persists only the kept plus the new rows.
    recorder.add_round(round_row(0, 2, 0.9, 3_000_000))
    recorder.flush()
    assert Recorder.load(run_dir).rounds().query("seed == 0")["round"].tolist() == [0, 1, 2]


def test_recorder_algorithm_tables_round_trip(tmp_path: Path):
    recorder = Recorder(tmp_path)
    rows = [{"seed": 0, "round": r, "i": 0, "j": 1, "s_ij": 0.5 * r} for r in (1, 2, 3)]
    recorder.add_rows("graph", rows)
    recorder.flush()
    loaded = Recorder.load(tmp_path)
    assert loaded.table("graph")["s_ij"].tolist() == [0.5, 1.0, 1.5]
    loaded.truncate_after(seed=0, round=2)
    assert loaded.table("graph")["round"].tolist() == [1, 2]


def test_summarize_two_seeds(run_dir: Path):
    summary = summarize(run_dir, "fedavg")
    assert summary["algorithm"] == "fedavg"
    assert summary["seeds"] == [0, 1]
    final = summary["final"]
    # Seed finals at round 2: 0.8 and 0.6 -> mean 0.7, population std 0.1.
    assert final["mean_accuracy"]["mean"] == pytest.approx(0.7)
    assert final["mean_accuracy"]["std"] == pytest.approx(0.1)
    assert final["worst10_accuracy"]["mean"] == pytest.approx(0.5)
    assert final["worst20_accuracy"]["std"] == pytest.approx(0.1)
    assert final["std_accuracy"] == {"mean": pytest.approx(0.05), "std": pytest.approx(0.0)}
    # Cost at round 3: cum_bits = 4e6 * (seed + 1) -> 4e6 and 8e6.
    assert final["total_bits"]["mean"] == pytest.approx(6e6)
    assert final["total_bits"]["std"] == pytest.approx(2e6)
    assert final["total_bits_up"]["mean"] == pytest.approx(3e6)
    assert final["wall_time"]["mean"] == pytest.approx(6.0)
    assert [row["round"] for row in summary["per_seed"]] == [2, 2]
    assert json.loads((run_dir / "summary.json").read_text()) == summary


def test_format_bits():
    assert format_bits(0) == "0 b"
    assert format_bits(999) == "999 b"
    assert format_bits(12_300_000) == "12.3 Mb"
    assert format_bits(4.5e9) == "4.5 Gb"


def render(table) -> str:
    console = Console(record=True, width=160)
    console.print(table)
    return console.export_text()


def test_results_table_one_row_per_summary(run_dir: Path, tmp_path: Path):
    other_dir = tmp_path / "other"
    recorder = Recorder(other_dir)
    fill_recorder(recorder, {0: 0.5})
    recorder.flush()
    summaries = [summarize(run_dir, "fedavg"), summarize(other_dir, "local")]
    table = results_table(summaries, title="Results")
    assert table.row_count == 2
    text = render(table)
    assert "fedavg" in text and "local" in text
    assert "70.0±10.0" in text  # fedavg mean accuracy in percent
    assert "50.0±0.0" in text  # fedavg worst-10%
    assert "6.0 Mb" in text and "4.0 Mb" in text
    assert "6.0 s" in text


def assert_png_files(paths: list[Path]) -> None:
    assert paths
    for path in paths:
        assert path.suffix == ".png"
        assert path.stat().st_size > 0
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_run(run_dir: Path):
    paths = plot_run(run_dir)
    assert [path.name for path in paths] == [
        "accuracy_vs_round.png",
        "accuracy_vs_bits.png",
        "client_accuracy_distribution.png",
    ]
    assert all(path.parent == run_dir / "plots" for path in paths)
    assert_png_files(paths)


def test_plot_comparison_with_zero_bit_run(run_dir: Path, tmp_path: Path):
    local_dir = tmp_path / "local"
    recorder = Recorder(local_dir)
    fill_recorder(recorder, {0: 0.5, 1: 0.55}, bits_scale=0)  # Local: nothing transmitted
    recorder.flush()
    assert_png_files(plot_run(local_dir))
    paths = plot_comparison({"fedavg": run_dir, "local": local_dir}, tmp_path / "compare")
    assert len(paths) == 3  # mean, worst-10% accuracy and bits per round
    assert_png_files(paths)


def test_plot_run_without_rows(tmp_path: Path):
    Recorder(tmp_path / "empty").flush()
    assert_png_files(plot_run(tmp_path / "empty"))


def test_report_prints_and_plots(run_dir: Path):
    console = Console(record=True, width=160)
    result = report(run_dir, console=console)
    assert result["algorithm"] == "fedavg"
    assert result["final"]["mean_accuracy"]["mean"] == pytest.approx(0.7)
    assert len(result["plots"]) == 3
    text = console.export_text()
    assert "fedavg" in text and "70.0±10.0" in text
    assert np.isclose(json.loads((run_dir / "summary.json").read_text())["seeds"], [0, 1]).all()


def test_summarize_draws_no_plot_even_for_an_algorithm_table(run_dir: Path):
    """Plots come from plot_run alone (a run with output.plots false never calls it), table
    plotters included; summarize only adds the tables' figures."""
    leaders = [
        {
            "seed": 0,
            "round": r,
            "group": 0,
            "leader": r % 2,
            "next_leader": (r + 1) % 2,
            "members": 2,
            "failover": False,
            "aggregate_seconds": 0.5,
        }
        for r in range(3)
    ]
    pd.DataFrame(leaders).to_parquet(run_dir / "leaders.parquet")
    summary = summarize(run_dir, "colnet")
    assert summary["leaders"]["rotations"] == 2 and summary["leaders"]["failovers"] == 0
    assert not (run_dir / "plots").exists()
    names = [path.name for path in plot_run(run_dir)]
    assert names[-1] == "leaders.png" and (run_dir / "plots" / "leaders.png").is_file()
