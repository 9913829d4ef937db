"""`raymtl tune`: a sweep of 4 trials on digits through Ray Tune, ASHA stopping on the
per-round metric, and the best configuration written as a file `raymtl run` takes."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

import raymtl
from raymtl.cli import app
from tests.conftest import write_experiment

pytestmark = [pytest.mark.ray, pytest.mark.cluster]


@pytest.mark.slow
def test_sweep_of_four_trials_writes_a_runnable_best_config(ray_session, tmp_path):
    from ray import tune

    class Results(tune.Callback):  # Tune's own callbacks see every trial's rounds
        def __init__(self):
            self.rounds: list[int] = []

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.rounds.append(result["round"])

    path = write_experiment(tmp_path, rounds=3)
    results = Results()
    sweep = raymtl.tune(
        path,
        [
            "algorithm.params.lr=grid(0.01, 0.1)",
            "algorithm.params.momentum=choice(0.0, 0.5)",
        ],
        search="grid",  # 2 x 2 values: 4 trials
        scheduler="asha",
        out=tmp_path / "sweep",
        callbacks=[results],
    )
    table = sweep.table
    assert len(table) == 4
    pairs = zip(table["algorithm.params.lr"], table["algorithm.params.momentum"], strict=True)
    assert sorted(pairs) == [
        (0.01, 0.0),
        (0.01, 0.5),
        (0.1, 0.0),
        (0.1, 0.5),
    ]
    # ASHA may stop trials early: that is no error; the best ran every round.
    assert set(table["status"]) <= {"done", "stopped early"} and "done" in set(table["status"])
    best = table.iloc[0]
    assert best["rounds"] == 3
    full = table[table["rounds"] == 3]
    assert best["mean_accuracy"] == full["mean_accuracy"].max()
    assert set(results.rounds) <= {1, 2, 3} and results.rounds.count(3) == len(full)
    # Tune's own loggers wrote the trials' results; each trial has its run directory.
    assert list((tmp_path / "sweep" / "tune").rglob("progress.csv"))
    assert len(list((tmp_path / "sweep" / "trials").iterdir())) == 4

    written = yaml.safe_load(sweep.best_file.read_text())
    assert written["algorithm"]["params"]["lr"] == best["algorithm.params.lr"]
    assert written["algorithm"]["params"]["momentum"] == best["algorithm.params.momentum"]
    assert sweep.best_params == {
        "algorithm.params.lr": best["algorithm.params.lr"],
        "algorithm.params.momentum": best["algorithm.params.momentum"],
    }
    ran = CliRunner().invoke(app, ["run", str(sweep.best_file), "rounds=1"])
    assert ran.exit_code == 0, ran.output
    assert "test-tuned" in ran.output


@pytest.mark.slow
def test_a_sweep_over_the_noise_multiplier_and_the_server_learning_rate(ray_session, tmp_path):
    """The toolbox's sections are settings like any other: Tune sweeps them (two trials)."""
    path = write_experiment(
        tmp_path,
        rounds=2,
        privacy={"clip": 0.5, "noise_multiplier": 1.0, "delta": 1e-3},
        server_optimizer={"name": "fedadam"},
    )
    sweep = raymtl.tune(
        path,
        ["privacy.noise_multiplier=grid(0.5, 2.0)", "server_optimizer.lr=choice(0.01)"],
        search="grid",
        out=tmp_path / "sweep",
    )
    table = sweep.table
    assert sorted(table["privacy.noise_multiplier"]) == [0.5, 2.0]
    assert set(table["status"]) == {"done"}
    best = yaml.safe_load((tmp_path / "sweep" / "best.yaml").read_text())
    assert best["privacy"]["noise_multiplier"] in (0.5, 2.0)
    assert best["server_optimizer"] == {**best["server_optimizer"], "name": "fedadam", "lr": 0.01}
