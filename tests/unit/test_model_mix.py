"""Clients whose models differ: assignment, the config's refusals, and what is recorded."""

from __future__ import annotations

import pandas as pd
import pytest

from raymtl.config import ConfigError, parse_config
from raymtl.models.assign import assign_models, mix_counts
from tests.conftest import digits_experiment


def test_mix_gives_near_equal_shares_dealt_by_seed():
    counts = mix_counts({"small": 0.34, "medium": 0.33, "large": 0.33}, 30)
    assert counts == {"small": 10, "medium": 10, "large": 10}
    assert sum(mix_counts({"a": 1, "b": 1, "c": 1}, 40).values()) == 40
    mix = {"small": 0.34, "medium": 0.33, "large": 0.33}
    first = assign_models(30, "x", seed=0, mix=mix)
    assert first == assign_models(30, "x", seed=0, mix=mix)  # seeded
    assert first != assign_models(30, "x", seed=1, mix=mix)
    assert sorted(pd.Series(first).value_counts().tolist()) == [10, 10, 10]


def test_models_by_task_and_by_client():
    tasks = ("a", "a", "b", "c")
    by_task = assign_models(4, "cnn", seed=0, by_task={"b": "mlp"}, task_names=tasks)
    assert by_task == ("cnn", "cnn", "mlp", "cnn")
    assert assign_models(2, "cnn", seed=0, clients=["mlp", "logreg"]) == ("mlp", "logreg")
    with pytest.raises(ValueError, match="model.clients: 1 names for 2 clients"):
        assign_models(2, "cnn", seed=0, clients=["mlp"])
    with pytest.raises(ValueError, match=r"model.by_task: \['z'\] are not tasks"):
        assign_models(4, "cnn", seed=0, by_task={"z": "mlp"}, task_names=tasks)


MIX = {"model.mix": {"mlp": 0.5, "logreg": 0.5}, "model.name": "mlp"}


@pytest.mark.parametrize("algorithm", ["fedavg", "dpsgd", "hfedavg", "colnet", "sfmtl_graph"])
def test_algorithms_needing_one_architecture_refuse_a_mix(tmp_path, algorithm):
    with pytest.raises(ConfigError) as error:
        parse_config(digits_experiment(tmp_path, **MIX, **{"algorithm.name": algorithm}))
    assert str(error.value).startswith("algorithm.name: ") and "local" in str(error.value)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"model.mix": {"nope": 1.0}}, "model: 'nope' is not one of"),
        ({"model.mix": {"mlp": 0.0}}, "share of 'mlp'"),
        ({"model.mix": {"mlp": 1.0}, "model.clients": ["mlp"]}, "only one of"),
        ({"model.clients": ["mlp", "logreg"], "model.params": {"hidden": 3}}, "model.params"),
    ],
)
def test_bad_model_sections_are_one_line(tmp_path, settings, field):
    with pytest.raises(ConfigError, match=field):
        parse_config(digits_experiment(tmp_path, **{"algorithm.name": "local", **settings}))


def test_models_by_task_are_checked_against_the_algorithm_before_ray_starts(tmp_path):
    from raymtl.runtime.executors.planning import check_federation

    one = {"model.by_task": {"label": "cnn_mnist"}, "algorithm.name": "fedavg"}
    check_federation(parse_config(digits_experiment(tmp_path, **one)))  # one architecture
    tasks = [{"name": "a", "clients": 3}, {"name": "b", "clients": 3}]
    two = {**one, "model.by_task": {"b": "mlp"}, "data.tasks": tasks, "data.partition.kind": "iid"}
    with pytest.raises(ConfigError, match="algorithm.name: fedavg needs every client"):
        check_federation(parse_config(digits_experiment(tmp_path, **two)))
