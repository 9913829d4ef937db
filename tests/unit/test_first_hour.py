"""The first hour of a new user (issue 41): the lines that refuse what they wrote name what
they wrote and what to write instead, without a run. The runs behind the other items are in
tests/integration/test_user_errors.py (a hook's step error, data.num_clients) and
test_federation_api.py (the server's model).

- an arm of a comparison that refuses a setting is named, with its override, and `arms:` is
  the way to give one arm its own params;
- an unknown name (algorithm, model, dataset, partition kind, topology, target) has a
  did-you-mean over the registered names (a plugin's too) and the `plugins:` hint; an
  unknown `algorithm.params` key a did-you-mean that knows other libraries' names;
- a partition's refusal of the client count names `data.num_clients`;
- a step error names the hook it called that raised;
- an error line is all a refused command prints (no blank line before it);
- `cli.py`'s classes are CapWords;
- the README says where raymtl and Ray write, as the code does.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import raymtl.cli
from raymtl.api.experiments import experiment_configs
from raymtl.cli import app
from raymtl.config import ConfigError, parse_config
from raymtl.config.base import did_you_mean
from raymtl.data import partition_clients
from raymtl.errors import step_raised
from raymtl.registry import Registry
from tests.conftest import digits_experiment, write_experiment

ROOT = Path(__file__).resolve().parents[2]
FEDAVGM = ROOT / "examples" / "fedavgm" / "fedavgm.py"


def refused(raw: dict) -> str:
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    (line,) = str(error.value).splitlines()
    return line


# -- 1. the arm that refused a setting, and `arms:`


def test_a_fanned_out_arm_that_refuses_a_setting_is_named_with_its_override(tmp_path):
    """FedNova takes `mu` (FedProx's proximal term), FedAvg does not: the fedavg arm of
    `algorithm.name=fednova,fedavg` refuses it, and says so."""
    raw = digits_experiment(tmp_path, **{"algorithm.params.mu": 0.1})
    with pytest.raises(ConfigError) as error:
        experiment_configs([raw], ["algorithm.name=fednova,fedavg"])
    (line,) = str(error.value).splitlines()
    assert line.startswith(
        "arm test-fedavg (algorithm.name=fedavg): algorithm.params.mu: unknown key; "
    )
    assert "comparison file's `arms:`" in line and "brings its own params" in line
    # The same setting in the arm that takes it, through `arms:`, is accepted.
    arms = digits_experiment(tmp_path)
    arms["arms"] = {
        "fednova": {"algorithm": {"name": "fednova", "params": {"epochs": 1, "mu": 0.1}}},
        "fedavg": {"algorithm": {"name": "fedavg", "params": {"epochs": 1}}},
    }
    configs = experiment_configs([arms])
    assert [(c.name, c.algorithm.params.get("mu")) for c in configs] == [
        ("fednova", 0.1),
        ("fedavg", None),
    ]


def test_an_arm_of_a_comparison_file_that_refuses_a_setting_is_named(tmp_path):
    raw = digits_experiment(tmp_path)
    raw["arms"] = {
        "good": {"algorithm": {"name": "fedavg"}},
        "bad": {"algorithm": {"name": "fedavg", "params": {"mu": 0.1}}},
    }
    with pytest.raises(ConfigError, match=r"^arm bad: algorithm.params.mu: unknown key$"):
        experiment_configs([raw])


def test_a_fanned_out_value_that_is_refused_itself_gets_no_arms_hint(tmp_path):
    with pytest.raises(ConfigError) as error:
        experiment_configs([digits_experiment(tmp_path)], ["algorithm.name=fedavgg,fedavg"])
    line = str(error.value)
    assert line.startswith("arm test-fedavgg (algorithm.name=fedavgg): algorithm.name: 'fedavgg'")
    assert "(did you mean fedavg?)" in line and "`arms:`" not in line


def test_one_experiment_is_refused_as_raymtl_run_refuses_it(tmp_path):
    raw = digits_experiment(tmp_path, **{"algorithm.params.mu": 0.1})
    with pytest.raises(ConfigError, match=r"^algorithm.params.mu: unknown key$"):
        experiment_configs([raw])


def test_compare_names_the_arm_that_refused_a_plugins_parameter(tmp_path):
    """The example plugin FedAvgM's own server_momentum, fanned out to fedavgm and fedavg:
    one line, exit code 2, naming the fedavg arm and pointing to `arms:`."""
    path = write_experiment(
        tmp_path,
        plugins=[str(FEDAVGM)],
        **{"algorithm.name": "fedavgm", "algorithm.params.server_momentum": 0.5},
    )
    result = CliRunner().invoke(app, ["compare", str(path), "algorithm.name=fedavgm,fedavg"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "error: arm test-fedavg (algorithm.name=fedavg): "
        "algorithm.params.server_momentum: unknown key; "
    )
    assert "`arms:`" in line
    assert not list(tmp_path.glob("compare-*")), "no comparison folder for a refused one"


# -- 2. did you mean, and `plugins:`


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        ({"algorithm.name": "fedavgg"}, "algorithm.name: 'fedavgg' is not one of "),
        ({"model.name": "cnn_mnst"}, "model.name: 'cnn_mnst' is not one of "),
        ({"data.name": "digit"}, "data.name: 'digit' is not one of "),
        ({"data.partition.kind": "dirichlett"}, "data.partition.kind: 'dirichlett' is not one of "),
        (
            {"data.tasks": [{"name": "t", "targets": "labl"}]},
            "data.tasks.0.targets: 'labl' is not one of ",
        ),
        (
            {"algorithm.name": "dfedu", "topology.kind": "erdos_renyii"},
            "topology.kind: 'erdos_renyii' is not one of ",
        ),
    ],
)
def test_an_unknown_name_says_the_nearest_and_where_plugins_come_from(tmp_path, overrides, line):
    meant = re.search(r"'(\w+)'", line).group(1)
    message = refused(digits_experiment(tmp_path, **overrides))
    assert message.startswith(line)
    nearest = {
        "fedavgg": "fedavg",
        "cnn_mnst": "cnn_mnist",
        "digit": "digits",
        "dirichlett": "dirichlet",
        "labl": "label",
        "erdos_renyii": "erdos_renyi",
    }[meant]
    assert f"(did you mean {nearest}?)" in message
    assert message.endswith("; a plugin's name is known once its file is listed under `plugins:`")


def test_a_name_near_no_registered_one_still_says_where_plugins_come_from():
    registry = Registry("algorithm.name")
    registry.add("fedavg", object())
    registry.add("local", object())
    line = registry.unknown("my_plugin_algorithm")
    assert line == (
        "algorithm.name: 'my_plugin_algorithm' is not one of fedavg, local; a plugin's name "
        "is known once its file is listed under `plugins:`"
    )
    with pytest.raises(ValueError, match="did you mean local"):
        registry.lookup("locl")
    assert registry.unknown("locl", field="").startswith("'locl' is not one of")


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("learning_rate", "lr"),
        ("local_epochs", "epochs"),
        ("num_epochs", "epochs"),
        ("batchsize", "batch_size"),
        ("sgd_momentum", "momentum"),
        ("momentun", "momentum"),  # a misspelling: difflib's
        ("weight_decy", "weight_decay"),
    ],
)
def test_an_unknown_algorithm_param_says_the_key_raymtl_uses(tmp_path, key, meant):
    message = refused(digits_experiment(tmp_path, **{f"algorithm.params.{key}": 1}))
    assert message == f"algorithm.params.{key}: unknown key (did you mean {meant}?)"


def test_a_synonym_is_offered_only_where_its_key_exists():
    assert did_you_mean("learning_rate", ["lr", "epochs"]) == " (did you mean lr?)"
    assert did_you_mean("learning_rate", ["alpha", "epochs"]) == ""
    assert did_you_mean("Learning_Rate", ["lr"]) == " (did you mean lr?)"


def test_an_unknown_section_key_has_the_synonyms_too(tmp_path):
    assert refused(digits_experiment(tmp_path, num_rounds=3)) == (
        "num_rounds: unknown key (did you mean rounds?)"
    )


# -- 3. data.num_clients, as the file gives it


def test_too_many_clients_for_the_samples_name_data_num_clients():
    labels = np.repeat(np.arange(10), 10)
    with pytest.raises(ValueError, match=r"^data.num_clients: 5000 clients exceed the 100 samples"):
        partition_clients(labels, 10, num_clients=5000, kind="iid", seed=0)
    with pytest.raises(ValueError, match=r"^data.partition.alpha: "):
        partition_clients(labels, 10, num_clients=5, kind="dirichlet", seed=0, alpha=0.0)


# -- 4. a step error names the hook that raised


class Base:
    def aggregate(self):
        return self.merge()

    def merge(self):
        return 1


class Hooked(Base):
    def merge(self):
        raise ValueError("merge is not written yet")


class Direct(Base):
    def aggregate(self):
        raise KeyError("state")


def raised_by(call) -> BaseException:
    try:
        call()
    except Exception as error:
        return error
    raise AssertionError("it did not raise")


def test_a_step_error_names_the_hook_that_raised_and_where():
    error = raised_by(Hooked().aggregate)
    line = inspect.getsourcelines(Hooked.merge)[1] + 1  # the raise
    assert step_raised(Hooked, "aggregate", error, "server, seed 0, round 1") == (
        f"Hooked.aggregate (in Hooked.merge, {__file__}:{line}) raised ValueError: merge is "
        "not written yet (server, seed 0, round 1)"
    )


def test_a_step_that_raised_itself_reads_as_before():
    error = raised_by(Direct().aggregate)
    line = inspect.getsourcelines(Direct.aggregate)[1] + 1
    assert step_raised(Direct, "aggregate", error, "server, seed 0, round 1") == (
        f"Direct.aggregate raised KeyError: 'state' ({__file__}:{line}; server, seed 0, round 1)"
    )
    assert step_raised(Direct, "aggregate", KeyError("x"), "server") == (
        "Direct.aggregate raised KeyError: 'x' (server)"  # no traceback: no place
    )


# -- 5. an error line and nothing else


@pytest.mark.parametrize(
    "arguments",
    [
        ["run", "{path}", "algorithm.name=fedavgg"],
        ["run", "{path}", "algorithm.params.learning_rate=0.1"],
        ["compare", "{path}", "algorithm.name=fedavg,local", "rounds=0"],
    ],
)
def test_a_refused_command_prints_its_error_line_alone(tmp_path, arguments):
    """A progress bar started before the experiment was validated left an empty line on
    the output (and, at a terminal, above the error)."""
    path = write_experiment(tmp_path)
    result = CliRunner().invoke(app, [a.format(path=path) for a in arguments])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


# -- 6. CapWords


def test_the_cli_classes_are_capwords():
    classes = [
        name
        for name, value in vars(raymtl.cli).items()
        if inspect.isclass(value) and value.__module__ == raymtl.cli.__name__
    ]
    assert {"InterruptedRun", "UserErrors", "RoundProgress"} <= set(classes)
    assert all(re.fullmatch(r"(?:[A-Z][a-z0-9]*)+", name) for name in classes), classes
    source = Path(raymtl.cli.__file__).read_text()
    assert "interrupted_run" not in source and "user_errors" not in source


# -- 7. the documented API: the server's state, resume's callbacks (the run: test_federation_api)


def test_the_server_state_and_resume_callbacks_are_documented():
    import raymtl

    state = inspect.getdoc(raymtl.Federation.state)
    assert '"server"' in state and "global model" in state
    assert "callbacks" in inspect.getdoc(raymtl.resume)
    readme = (ROOT / "README.md").read_text()
    python_api = readme[readme.index("## Python API") : readme.index("## Benchmarks")]
    assert 'fed.state("server")' in python_api and "raymtl.resume(run_dir, callbacks=" in python_api


# -- 8. where raymtl and Ray write


def test_the_readme_says_where_raymtl_and_ray_write(tmp_path, monkeypatch):
    from raymtl.data.pool_cache import cache_root
    from raymtl.paths import raymtl_home
    from raymtl.runtime.warm.preload import SOCKET_FILE
    from raymtl.runtime.warm.service import STATE_FILE, quiet_local_ray

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Outside the run directory") :]
    section = section[: section.index("\n## ")]
    for named in ("`$RAYMTL_HOME`", "`~/.raymtl`", STATE_FILE, SOCKET_FILE, "up.log"):
        assert named in section
    for named in ("cache/pools/", "cache/catalogue/", "RAYMTL_POOL_CACHE", "RAYMTL_CATALOGUE"):
        assert named in section
    for named in ("`$RAY_TMPDIR/ray`", "`$TMPDIR/ray`", "`/tmp/ray`", "--temp-dir"):
        assert named in section
    # ... as the code does: raymtl's folder moves with RAYMTL_HOME, its caches inside it
    monkeypatch.delenv("RAYMTL_HOME", raising=False)
    assert raymtl_home() == Path.home() / ".raymtl"
    monkeypatch.setenv("RAYMTL_HOME", str(tmp_path))
    assert raymtl_home() == tmp_path
    assert cache_root() == tmp_path / "cache" / "pools"
    # ... and a local Ray gets no folder from raymtl: Ray's own default
    assert not any("temp" in key for key in quiet_local_ray(2, dashboard=False))


def test_a_comparison_file_with_arms_is_accepted_in_a_yaml_file(tmp_path):
    """The README's way out of the first test's refusal, as a file `raymtl compare` reads."""
    raw = digits_experiment(tmp_path)
    raw["arms"] = {"fednova": {"algorithm": {"name": "fednova", "params": {"mu": 0.1}}}}
    path = tmp_path / "arms.yaml"
    path.write_text(yaml.safe_dump(raw))
    (config,) = experiment_configs([str(path)])
    assert config.name == "fednova" and config.algorithm.params == {"mu": 0.1}


def test_the_lookups_after_validation_say_did_you_mean_too():
    from raymtl.data.partition_registry import get_partition
    from raymtl.data.source_registry import check_source_params
    from raymtl.tasks.registry import get_target

    for lookup, near, meant in (
        (get_partition, "dirichlett", "dirichlet"),
        (lambda name: check_source_params(name, {}), "digit", "digits"),
        (get_target, "labl", "label"),
    ):
        with pytest.raises(ValueError, match=rf"did you mean {meant}\?.*`plugins:`"):
            lookup(near)


def test_a_stopped_run_prints_the_resume_command():
    from types import SimpleNamespace

    from raymtl.cli import InterruptedRun
    from raymtl.runtime.faults import RunStopped

    progress = SimpleNamespace(run_dir="runs/test-1")
    with pytest.raises(RunStopped) as stopped, InterruptedRun(progress):
        raise RunStopped("runtime.max_restarts: 0 recoveries used up; seed 0 round 2")
    line = str(stopped.value)
    assert line.startswith("runtime.max_restarts: 0 recoveries used up; seed 0 round 2; ")
    assert "`raymtl run --resume runs/test-1` goes on from the last complete checkpoint" in line
