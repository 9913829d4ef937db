"""MLflowCallback: a run read back from the MLflow store it wrote (InlineExecutor, digits)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

import raymtl
from raymtl.cli import app
from tests.conftest import digits_experiment, write_experiment

mlflow_tracking = pytest.importorskip("mlflow.tracking")


@pytest.fixture(autouse=True)
def no_tracking_uri(monkeypatch):
    """The default store, whatever the environment of the test says."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def store_runs(tracking_uri: str, experiment: str = "test") -> tuple:
    """(client, the raymtl run's MLflow run, its seed runs by seed)."""
    client = mlflow_tracking.MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id])
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    seeds = {
        int(run.data.tags["raymtl.seed"]): run
        for run in runs
        if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    return client, parent, seeds


def history(client, run, metric: str) -> dict[int, float]:
    """step (round) -> value; one value per step, or it fails."""
    logged = client.get_metric_history(run.info.run_id, metric)
    steps = [m.step for m in logged]
    assert len(set(steps)) == len(steps), f"{metric}: several values for a round"
    return {m.step: m.value for m in logged}


def test_params_one_metric_per_round_and_the_outputs_reach_the_store(tmp_path):
    raw = digits_experiment(tmp_path, rounds=2, seeds=[0, 1])
    results = raymtl.run(raw, callbacks=[raymtl.MLflowCallback()])
    client, parent, seeds = store_runs(f"file:{tmp_path}/mlruns")
    params = parent.data.params
    assert params["algorithm.name"] == "fedavg" and params["rounds"] == "2"
    assert params["algorithm.params.lr"] == "0.1" and params["seeds"] == "[0, 1]"
    assert params["data.partition.rotations"] == "[0, 90, 180]"
    assert parent.info.run_name == results.run_dir.name
    assert parent.data.tags["raymtl.run_dir"] == str(results.run_dir)
    assert sorted(seeds) == [0, 1]
    rounds = results.rounds.set_index(["seed", "round"])
    for seed, run in seeds.items():
        for metric in ("mean_accuracy", "mean_loss", "cum_bits", "wall_time"):
            expected = {r: rounds.loc[(seed, r), metric] for r in (1, 2)}
            assert history(client, run, metric) == pytest.approx(expected), (seed, metric)
        assert run.info.status == "FINISHED"
    final = results.summary["final"]["mean_accuracy"]["mean"]
    assert parent.data.metrics["final.mean_accuracy"] == pytest.approx(final)
    artifacts = {item.path for item in client.list_artifacts(parent.info.run_id)}
    assert {"config.yaml", "rounds.parquet", "clients.parquet", "summary.json"} <= artifacts
    assert "checkpoints" not in artifacts


def test_a_resumed_run_goes_on_in_its_mlflow_runs(tmp_path):
    from raymtl.runtime import run_experiment

    cfg = raymtl.ExperimentConfig.model_validate(digits_experiment(tmp_path, rounds=3))
    uri = f"file:{tmp_path}/store"
    run_dir = run_experiment(
        cfg, tmp_path / "run", stop_after=1, callbacks=[raymtl.MLflowCallback(uri)]
    )
    results = raymtl.resume(run_dir, callbacks=[raymtl.MLflowCallback(uri)])
    client, parent, seeds = store_runs(uri)
    expected = dict(zip(results.rounds["round"], results.rounds["mean_loss"], strict=True))
    assert list(expected) == [1, 2, 3]
    assert history(client, seeds[0], "mean_loss") == pytest.approx(expected)
    assert parent.info.status == "FINISHED"


def test_the_cli_logs_with_mlflow_and_names_the_extra_when_it_is_missing(tmp_path, monkeypatch):
    path = write_experiment(tmp_path, rounds=1)
    uri = f"file:{tmp_path}/cli-store"
    result = CliRunner().invoke(app, ["run", str(path), "--mlflow-uri", uri])
    assert result.exit_code == 0, result.output
    client, parent, seeds = store_runs(uri)
    assert parent.data.params["rounds"] == "1" and len(history(client, seeds[0], "cum_bits")) == 1
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    result = CliRunner().invoke(app, ["run", str(path), "--mlflow"])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert "install raymtl[mlflow]" in line
    assert len(list(tmp_path.glob("test-*"))) == 1, "no run started without its tracker"


def test_one_callback_logs_every_run_of_a_comparison(tmp_path):
    uri = f"file:{tmp_path}/store"
    comparison = raymtl.compare(
        [digits_experiment(tmp_path, rounds=1)],
        ["algorithm.name=fedavg,local"],
        out=tmp_path / "cmp",
        callbacks=[raymtl.MLflowCallback(uri, experiment="cmp")],
    )
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("cmp").experiment_id])
    parents = {run.info.run_name: run for run in runs if "mlflow.parentRunId" not in run.data.tags}
    assert sorted(parents) == ["test-fedavg", "test-local"]
    for name, parent in parents.items():
        (seed,) = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        bits = comparison.runs[name].rounds["cum_bits"].tolist()
        assert list(history(client, seed, "cum_bits").values()) == bits
        assert parent.data.params["algorithm.name"] == name.removeprefix("test-")
