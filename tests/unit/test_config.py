"""Bad experiments are rejected with one line naming the field (no Ray)."""

from __future__ import annotations

import pytest
import yaml

from raymtl.config import ConfigError, dump_config, load_config, parse_config
from tests.conftest import digits_experiment


def rejected(tmp_path, **overrides) -> str:
    with pytest.raises(ConfigError) as error:
        parse_config(digits_experiment(tmp_path, **overrides))
    message = str(error.value)
    assert "\n" not in message
    return message


def test_defaults_resolve_the_topology_from_the_algorithm(make_config):
    assert make_config().topology.kind == "star"
    assert make_config(**{"algorithm.name": "dpsgd"}).topology.kind == "erdos_renyi"
    assert make_config(**{"algorithm.name": "hfedavg"}).topology.kind == "hierarchical"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"data.colour": "red"}, "data.colour: unknown key"),
        ({"rounds": "many"}, "rounds:"),
        ({"rounds": 0}, "rounds:"),
        ({"algorithm.name": "fedsgd"}, "algorithm.name: 'fedsgd' is not one of"),
        ({"algorithm.params": {"lr": -1}}, "algorithm.params.lr:"),
        ({"algorithm.params": {"momentun": 0.9}}, "algorithm.params.momentun: unknown key"),
        ({"topology.kind": "ring"}, "topology.kind: fedavg runs on star"),
        ({"data.partition.kind": "shards"}, "data.partition.kind:"),
        ({"runtime.executor": "dask"}, "runtime.executor:"),
        ({"data.name": "imagenet"}, "data.name: 'imagenet' is not one of"),
        ({"model.name": "vgg"}, "model.name: 'vgg' is not one of"),
        ({"runtime.clients_per_actor": 0}, "runtime.clients_per_actor: 0 clients an actor"),
        ({"runtime.memory_budget": -1}, "runtime.memory_budget: -1 is not a positive size"),
        ({"runtime.memory_budget": "ten"}, "runtime.memory_budget: 'ten' is not a size"),
        ({"metrics.target": 80}, "metrics.target: 80.0 is not an accuracy in (0, 1]"),
        ({"metrics.target": 0}, "metrics.target: 0.0 is not an accuracy in (0, 1]"),
        ({"metrics.target": float("inf")}, "metrics.target:"),
        ({"metrics.target": "high"}, "metrics.target:"),
        ({"metrics.metric": "f1"}, "metrics.metric:"),
        ({"metrics.goal": 0.8}, "metrics.goal: unknown key"),
    ],
)
def test_one_line_errors_name_the_field(tmp_path, overrides, field):
    assert field in rejected(tmp_path, **overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"data.num_client": 3}, "data.num_client: unknown key (did you mean num_clients?)"),
        ({"rounds": 2, "round": 3}, "round: unknown key (did you mean rounds?)"),
        (
            {"data.partition.classes_per_clent": 2},
            "data.partition.classes_per_clent: unknown key (did you mean classes_per_client?)",
        ),
        (
            {"runtime.clients_per_actr": 2},
            "runtime.clients_per_actr: unknown key (did you mean clients_per_actor?)",
        ),
        (
            {"algorithm.params": {"momentun": 0.9}},
            "algorithm.params.momentun: unknown key (did you mean momentum?)",
        ),
        ({"metrics.goal": 0.8}, "metrics.goal: unknown key"),  # no key is near it
        ({"data.colour": "red"}, "data.colour: unknown key"),
    ],
)
def test_an_unknown_key_names_the_allowed_key_it_is_a_near_miss_of(tmp_path, overrides, message):
    assert rejected(tmp_path, **overrides) == message


def test_metrics_target_defaults_to_none_and_a_loss_target_may_exceed_one(make_config):
    assert make_config().metrics.target is None
    assert make_config().metrics.metric == "mean_accuracy"
    metrics = make_config(**{"metrics.target": 1.5, "metrics.metric": "mean_loss"}).metrics
    assert (metrics.target, metrics.metric) == (1.5, "mean_loss")


def test_more_lps_than_clients_is_rejected(tmp_path):
    message = rejected(tmp_path, **{"algorithm.name": "hfedavg", "topology.num_lps": 7})
    assert message.startswith("topology.num_lps: 7 LPSs for only 6 clients")


def test_a_disconnected_graph_is_rejected(tmp_path):
    message = rejected(
        tmp_path,
        **{
            "algorithm.name": "dpsgd",
            "topology.kind": "custom",
            "topology.params": {"edges": [[0, 1], [2, 3], [4, 5]]},
        },
    )
    assert message.startswith("topology.params.edges: the graph is not connected")


def test_bad_graph_parameters_are_rejected(tmp_path):
    message = rejected(
        tmp_path,
        **{"algorithm.name": "dpsgd", "topology.kind": "erdos_renyi", "topology.params": {"p": 2}},
    )
    assert message.startswith("topology.params.p")


def test_sizes_and_actors_that_are_settings(make_config):
    runtime = make_config(**{"runtime.memory_budget": "1.5 GiB"}).runtime
    assert runtime.memory_budget == "1.5 GiB"  # kept as written: config.yaml shows it so
    assert make_config(**{"runtime.clients_per_actor": 3}).runtime.clients_per_actor == 3


def test_file_overrides_and_round_trip(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(digits_experiment(tmp_path)))
    cfg = load_config(path, ["rounds=7", "algorithm.params.lr=0.2", "data.partition.kind=iid"])
    assert (cfg.rounds, cfg.algorithm.typed_params().lr) == (7, 0.2)
    assert cfg.data.partition.kind == "iid"
    again = parse_config(yaml.safe_load(dump_config(cfg)))
    assert again == cfg


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="experiment file: .* does not exist"):
        load_config(tmp_path / "nope.yaml")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(digits_experiment(tmp_path)))
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_config(path, ["rounds"])


def test_plugins_load_before_validation_and_are_kept_absolute(tmp_path, monkeypatch):
    (tmp_path / "plugin_dir").mkdir()
    plugin = tmp_path / "plugin_dir" / "empty_plugin.py"
    plugin.write_text("LOADED = True\n")
    monkeypatch.chdir(tmp_path)
    cfg = parse_config({"plugins": ["plugin_dir/empty_plugin.py"], **digits_experiment(tmp_path)})
    assert cfg.plugins == [str(plugin.resolve())]
    assert yaml.safe_load(dump_config(cfg))["plugins"] == [str(plugin.resolve())]
    assert parse_config({"plugins": str(plugin), **digits_experiment(tmp_path)}) == cfg
    assert rejected(tmp_path, plugins={"a": 1}).startswith("plugins: Input should be a valid list")
