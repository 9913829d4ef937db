"""`metrics.target` and peak memory through a real (inline) comparison: each arm's
summary.json, the comparison's table.csv and its console table."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from rich.console import Console

import raymtl
from raymtl.api.comparison import print_comparison
from raymtl.config import ConfigError
from tests.conftest import digits_experiment


def test_compare_reports_rounds_bits_and_memory_to_the_target(tmp_path):
    # Clients hold 2 classes each: 5% accuracy is reached at the first evaluated round.
    experiment = digits_experiment(tmp_path, rounds=3, **{"metrics.target": 0.05})
    comparison = raymtl.compare([experiment], ["algorithm.name=fedavg,local"], out=tmp_path / "c")
    for name, results in comparison.runs.items():
        summary = json.loads((results.run_dir / "summary.json").read_text())
        target = summary["target"]
        assert (target["metric"], target["target"], target["reached"]) == ("mean_accuracy", 0.05, 1)
        assert target["per_seed"]["0"]["round"] == 1
        assert target["rounds"] == {"mean": 1.0, "std": 0.0}
        rounds = results.rounds.set_index("round")
        assert target["per_seed"]["0"]["bits"] == rounds.loc[1, "cum_bits"]
        assert (target["bits"]["mean"] > 0) == (name == "test-fedavg")  # local sends nothing
        memory = summary["peak_memory"]
        assert memory["one_process"] is True  # inline: every host is this process
        assert memory["total_bytes"]["mean"] == memory["largest_host_bytes"]["mean"] > 0
    table = pd.read_csv(comparison.out_dir / "table.csv").set_index("experiment")
    assert (table["target_reached"] == 1.0).all()
    assert (table["target_rounds_mean"] == 1.0).all()
    assert table.loc["test-local", "target_bits_mean"] == 0
    assert table.loc["test-fedavg", "target_bits_mean"] > 0
    assert (table["peak_memory_bytes"] > 1e6).all()
    console = Console(record=True, width=240)
    print_comparison(comparison, console)
    text = console.export_text()
    assert "Peak mem" in text and "Rounds to target" in text and "1.0±0.0" in text
    assert "target: mean_accuracy >= 0.05" in text


def test_compare_refuses_arms_with_different_targets(tmp_path):
    arms = [
        digits_experiment(tmp_path, name="a", **{"metrics.target": 0.8}),
        digits_experiment(tmp_path, name="b", **{"metrics.target": 0.9}),
    ]
    with pytest.raises(ConfigError, match="^metrics: 'b' differs from 'a'"):
        raymtl.compare(arms, out=tmp_path / "c")
