"""`raymtl tune --param` specs, and the trials' resources of `compare --parallel` / `tune`.

The placement groups are checked against hand-computed layouts: a trial's bundles are its
client actors (num_cpus_per_actor, num_gpus_per_actor each) behind an empty head bundle.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from raymtl.api.tuning import ParamSpec, parse_param
from raymtl.cli import app
from raymtl.config import ConfigError, with_values
from raymtl.runtime.trials.plans import ClusterRoom, parse_parallel, plan_trials, trial_bundles
from tests.conftest import write_experiment


def test_param_kinds_parse_to_their_values():
    assert parse_param("algorithm.params.lr=loguniform(1e-3, 1e-1)") == ParamSpec(
        "algorithm.params.lr", "loguniform", (0.001, 0.1)
    )
    assert parse_param("algorithm.params.lam = choice(0.001, 0.01)") == ParamSpec(
        "algorithm.params.lam", "choice", (0.001, 0.01)
    )
    assert parse_param("algorithm.params.epochs=randint(1, 4)").values == (1, 4)
    assert parse_param("algorithm.params.momentum=uniform(0, 1)").values == (0.0, 1.0)
    # Words need no quotes; lists are one value each.
    assert parse_param("algorithm.name=grid(fedavg, local)").values == ("fedavg", "local")
    rotations = parse_param("data.partition.rotations=choice([0, 90], [0, 180])")
    assert rotations.values == ([0, 90], [0, 180])


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("algorithm.params.lr", "is not key.path=kind(values)"),
        ("algorithm.params.lr=normal(0, 1)", "unknown kind 'normal'"),
        ("algorithm.params.lr=uniform(1)", "takes two numbers"),
        ("algorithm.params.lr=uniform(0.1, 0.01)", "needs low < high"),
        ("algorithm.params.lr=loguniform(0, 1)", "needs low > 0"),
        ("algorithm.params.epochs=randint(1, 2.5)", "two whole numbers"),
        ("algorithm.params.lr=choice()", "needs values"),
    ],
)
def test_a_bad_param_is_one_error_naming_what_is_allowed(spec, why):
    with pytest.raises(ConfigError) as raised:
        parse_param(spec)
    message = str(raised.value)
    assert message.startswith(f"--param: '{spec}'") and why in message
    assert "loguniform(low, high)" in message and "choice(a, b, ...)" in message
    assert "\n" not in message


def test_grid_search_takes_only_listed_values():
    from ray import tune

    assert parse_param("a.b=choice(1, 2)").domain("grid") == tune.grid_search([1, 2])
    assert parse_param("a.b=choice(1, 2)").size("grid") == 2
    assert parse_param("a.b=choice(1, 2)").size("random") == 1
    with pytest.raises(ConfigError, match="--search grid: 'a.b' is uniform"):
        parse_param("a.b=uniform(0, 1)").domain("grid")


def test_values_go_into_nested_settings_of_a_copy():
    base = {"algorithm": {"name": "fedavg", "params": {"lr": 0.1}}}
    raw = with_values(base, {"algorithm.params.lr": 0.01, "algorithm.params.lam": 2})
    assert raw["algorithm"]["params"] == {"lr": 0.01, "lam": 2}
    assert base["algorithm"]["params"] == {"lr": 0.1}


def test_cli_bad_param_is_one_line_and_exit_2(tmp_path):
    path = write_experiment(tmp_path)
    result = CliRunner().invoke(app, ["tune", str(path), "--param", "algorithm.params.lr=1e-3"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert "--param: 'algorithm.params.lr=1e-3' is not key.path=kind(values)" in line
    assert "uniform(low, high)" in line


def test_cli_param_naming_no_setting_is_refused_before_any_trial(tmp_path):
    path = write_experiment(tmp_path)
    result = CliRunner().invoke(
        app, ["tune", str(path), "--param", "algorithm.params.lrr=choice(0.1, 0.2)"]
    )
    assert result.exit_code == 2 and "--param:" in result.output and "lrr" in result.output
    assert not list(tmp_path.glob("tune-*")), "no sweep folder for a refused sweep"


def test_parallel_option_values():
    assert parse_parallel("auto") == "auto"
    assert parse_parallel("3") == 3
    for bad in ("0", "-1", "many"):
        with pytest.raises(ConfigError, match="--parallel: give a number of trials"):
            parse_parallel(bad)


def test_trial_bundles_follow_the_runtime_settings(make_config):
    # 6 clients, 2 an actor: 3 client actors of 0.5 CPU and 0.25 GPU behind an empty head.
    cfg = make_config(
        **{
            "runtime.executor": "ray",
            "runtime.clients_per_actor": 2,
            "runtime.num_cpus_per_actor": 0.5,
            "runtime.num_gpus_per_actor": 0.25,
        }
    )
    assert trial_bundles(cfg, trial_cpus=99) == [{}] + [{"CPU": 0.5, "GPU": 0.25}] * 3
    # auto: the trial's share of the cluster once (5 CPUs / 1 CPU an actor: 5 actors).
    auto = make_config(**{"runtime.executor": "ray", "runtime.clients_per_actor": "auto"})
    assert trial_bundles(auto, trial_cpus=5) == [{}] + [{"CPU": 1.0}] * 5
    assert len(trial_bundles(auto, trial_cpus=64)) == 1 + 6  # never more actors than clients
    # inline: the whole federation in the trial's process.
    assert trial_bundles(make_config(), trial_cpus=8) == [{"CPU": 1.0}]


def test_plan_trials_shares_the_cluster(make_config):
    auto = make_config(**{"runtime.executor": "ray", "runtime.clients_per_actor": "auto"})
    # 12 trials on 6 CPUs: auto runs 6 at once (one 1-CPU actor each).
    in_flight, plans = plan_trials([auto], 12, "auto", ClusterRoom(cpus=6, gpus=0))
    assert in_flight == 6 and plans["test"] == [{}, {"CPU": 1.0}]
    # An explicit 2 at once: each takes half the cluster (3 actors).
    in_flight, plans = plan_trials([auto], 12, 2, ClusterRoom(cpus=6, gpus=0))
    assert in_flight == 2 and plans["test"] == [{}] + [{"CPU": 1.0}] * 3
    fixed = make_config(**{"runtime.executor": "ray", "runtime.clients_per_actor": 2})
    # 3 actors of 1 CPU a trial: 7 CPUs hold 2 trials; never more than the trials.
    assert plan_trials([fixed], 12, "auto", ClusterRoom(cpus=7, gpus=0))[0] == 2
    assert plan_trials([fixed], 1, "auto", ClusterRoom(cpus=70, gpus=0))[0] == 1
    with pytest.raises(ConfigError, match="needs 3 CPU .* the cluster has 2"):
        plan_trials([fixed], 4, 2, ClusterRoom(cpus=2, gpus=0))


def test_auto_trials_share_the_gpus_as_well_as_the_cpus(make_config):
    """16 CPUs and 1 GPU, quarter-GPU actors, 2 trials at once: each trial's half GPU holds
    2 client actors, not the 8 its 8 CPUs would."""
    gpus = make_config(
        **{
            "runtime.executor": "ray",
            "runtime.clients_per_actor": "auto",
            "runtime.num_gpus_per_actor": 0.25,
        }
    )
    in_flight, plans = plan_trials([gpus], 4, 2, ClusterRoom(cpus=16, gpus=1))
    assert in_flight == 2 and plans["test"] == [{}] + [{"CPU": 1.0, "GPU": 0.25}] * 2
