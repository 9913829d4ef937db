"""The Python API as a user's script meets it: raymtl.run / compare / Federation with
callbacks, on digits with the InlineExecutor."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import raymtl
from tests.conftest import digits_experiment, write_experiment


class Recorded(raymtl.Callback):
    """Every call the driver makes, in order; stops a seed after `stop_at` rounds."""

    def __init__(self, stop_at: int | None = None):
        self.calls: list[tuple] = []
        self.events: list[raymtl.RoundEvent] = []
        self.stop_at = stop_at

    def on_run_start(self, config, run_dir):
        self.calls.append(("start", config.name, run_dir))

    def on_round_end(self, event):
        self.calls.append(("round", event.seed, event.round))
        self.events.append(event)
        return self.stop_at is not None and event.round >= self.stop_at

    def on_run_end(self, run_dir):
        self.calls.append(("end", run_dir))


def test_the_public_names_resolve_to_the_objects_they_name():
    import raymtl.cli  # imports raymtl.api.comparison: raymtl.compare must stay the function
    from raymtl.api.callbacks import Callback
    from raymtl.config import ExperimentConfig

    assert callable(raymtl.compare) and raymtl.compare.__module__ == "raymtl.api.comparison"
    assert raymtl.ExperimentConfig is ExperimentConfig and raymtl.Callback is Callback
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        raymtl.nonsense  # noqa: B018


def test_every_name_a_plugin_author_needs_is_public_from_raymtl():
    import raymtl.extend

    assert raymtl.extend.__all__
    for name in raymtl.extend.__all__:
        assert getattr(raymtl, name) is getattr(raymtl.extend, name), name
    assert set(raymtl.extend.__all__) | {"run", "Federation"} <= set(raymtl.__all__)


def test_run_takes_a_mapping_and_returns_its_results(tmp_path):
    results = raymtl.run(digits_experiment(tmp_path), overrides=["rounds=2"])
    assert isinstance(results, raymtl.Results) and results.uri is None
    assert results.run_dir.is_dir() and results.run_dir.parent == tmp_path
    assert results.run_dir.name.startswith("test-")
    assert results.rounds["round"].tolist() == [1, 2]
    assert results.config.rounds == 2 and results.summary["algorithm"] == "fedavg"
    assert 0 < results.summary["final"]["mean_accuracy"]["mean"] <= 1
    assert set(results.clients["client"]) == set(range(6))
    again = raymtl.load_results(results.run_dir)
    pd.testing.assert_frame_equal(again.rounds, results.rounds)


def test_a_run_kept_at_a_uri_has_a_local_folder_and_its_uri(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "raymtl.runtime.storage.run_dirs.DEFAULT_CACHE_ROOT", str(tmp_path / "cache")
    )
    uri = f"file://{tmp_path}/remote"
    results = raymtl.run(digits_experiment(tmp_path, **{"rounds": 1, "output.dir": uri}))
    assert results.uri.startswith(f"{uri}/test-") and results.location == results.uri
    assert results.run_dir.is_relative_to(tmp_path / "cache") and results.run_dir.is_dir()
    assert results.rounds["round"].tolist() == [1]
    fetched = raymtl.load_results(results.uri)
    assert fetched.uri == results.uri and fetched.run_dir == results.run_dir
    pd.testing.assert_frame_equal(fetched.rounds, results.rounds)
    remote = tmp_path / "remote" / results.uri.rsplit("/", 1)[1]
    assert (remote / "summary.json").is_file()
    # What a Ctrl-C tells the user to resume (raymtl.cli): the URI, not the staging folder
    from raymtl.runtime.storage.run_dirs import resumable_location

    assert resumable_location(uri, results.run_dir) == results.uri
    assert resumable_location(str(tmp_path), tmp_path / "test-x") == str(tmp_path / "test-x")


def test_run_takes_a_path_and_a_config_alike(tmp_path):
    cfg = raymtl.ExperimentConfig.model_validate(digits_experiment(tmp_path, rounds=1))
    from_config = raymtl.run(cfg, run_dir=tmp_path / "a")
    from_file = raymtl.run(write_experiment(tmp_path, rounds=1), run_dir=tmp_path / "b")
    assert from_config.run_dir == (tmp_path / "a").resolve()
    columns = ["seed", "round", "mean_accuracy", "mean_loss", "cum_bits"]
    pd.testing.assert_frame_equal(from_config.rounds[columns], from_file.rounds[columns])


def test_a_bad_experiment_is_one_config_error_line(tmp_path):
    with pytest.raises(raymtl.ConfigError, match="^model.widht: unknown key"):
        raymtl.run(digits_experiment(tmp_path), overrides=["model.widht=3"])
    with pytest.raises(raymtl.ConfigError, match="not int"):
        raymtl.run(3)
    assert not list(tmp_path.glob("test-*"))


def test_callbacks_see_every_round_with_its_rows(tmp_path):
    recorded = Recorded()
    results = raymtl.run(
        digits_experiment(tmp_path, rounds=3, seeds=[0, 1], eval_every=2), callbacks=[recorded]
    )
    run_dir = results.run_dir
    rounds = [("round", seed, r) for seed in (0, 1) for r in (1, 2, 3)]
    assert recorded.calls == [("start", "test", run_dir), *rounds, ("end", run_dir)]
    for event in recorded.events:
        row = results.rounds.set_index(["seed", "round"]).loc[(event.seed, event.round)]
        assert event.rounds == 3 and event.row["cum_bits"] == row["cum_bits"]
        evaluated = event.round in (2, 3)  # every 2nd round and the last
        assert math.isnan(event.row["mean_accuracy"]) != evaluated
        assert len(event.clients) == (6 if evaluated else 0)
        if evaluated:
            assert event.row["mean_accuracy"] == pytest.approx(row["mean_accuracy"])
            assert {client["client"] for client in event.clients} == set(range(6))


def test_a_callback_stops_each_seed_early(tmp_path):
    recorded = Recorded(stop_at=2)
    results = raymtl.run(digits_experiment(tmp_path, rounds=5, seeds=[0, 1]), callbacks=[recorded])
    assert results.rounds[["seed", "round"]].values.tolist() == [[0, 1], [0, 2], [1, 1], [1, 2]]
    assert [call for call in recorded.calls if call[0] == "round"] == [
        ("round", 0, 1),
        ("round", 0, 2),
        ("round", 1, 1),
        ("round", 1, 2),
    ]
    assert [row["round"] for row in results.summary["per_seed"]] == [2, 2]


def test_compare_returns_the_table_and_every_run(tmp_path):
    comparison = raymtl.compare(
        [digits_experiment(tmp_path)], ["algorithm.name=fedavg,local"], out=tmp_path / "cmp"
    )
    assert isinstance(comparison, raymtl.Comparison)
    assert comparison.out_dir == (tmp_path / "cmp").resolve()
    table = comparison.table
    assert table["experiment"].tolist() == ["test-fedavg", "test-local"]
    pd.testing.assert_frame_equal(table, pd.read_csv(comparison.out_dir / "table.csv"))
    assert table.loc[1, "total_bits_mean"] == 0 and table.loc[0, "total_bits_mean"] > 0
    assert list(comparison.runs) == ["test-fedavg", "test-local"]
    local = comparison.runs["test-local"]
    assert local.run_dir == comparison.out_dir / "test-local"
    assert local.config.algorithm.name == "local"
    assert [s["algorithm"] for s in comparison.summaries] == ["test-fedavg", "test-local"]
    # Local is the reference of Δ%: 0 for itself
    assert local.summary["delta_vs_local"]["delta_percent"]["mean"] == 0
    assert not (comparison.out_dir / "plots").exists()  # output.plots: false


def test_a_federation_driven_round_by_round_matches_a_run(tmp_path):
    """raymtl.Federation: the rounds raymtl.run runs, one call at a time, with the clients'
    kept tensors readable in between."""
    cfg = raymtl.ExperimentConfig.model_validate(
        digits_experiment(tmp_path, **{"rounds": 2, "algorithm.name": "local"})
    )
    whole = raymtl.run(cfg, run_dir=tmp_path / "whole")
    with raymtl.Federation(cfg, run_dir=tmp_path / "stepped") as federation:
        first = federation.run_round()
        assert federation.round == 1 and first.round == 1 and first.seed == 0
        model = federation.state(0)["model"]  # Local: each client keeps its own model
        assert model and all(torch.isfinite(tensor).all() for tensor in model.values())
        second = federation.run_round()
        assert federation.done
    assert second.round == 2
    stepped = raymtl.load_results(tmp_path / "stepped")  # closed: a finished run
    assert stepped.rounds["round"].tolist() == [1, 2] and stepped.summary["final"]
    for event in (first, second):
        row = whole.rounds[whole.rounds["round"] == event.round].iloc[0]
        assert event.row["mean_accuracy"] == pytest.approx(row["mean_accuracy"])
        assert event.row["mean_loss"] == pytest.approx(row["mean_loss"])
