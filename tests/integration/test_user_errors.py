"""An error in a user's own code is one line naming the culprit: a plugin's constructor or
`Params` raising (exit 2), a model whose output is not its task's classes (exit 2, before any
round), a step that raises (exit 1, the traceback in run.log, the run marked FAILED); inline
and on Ray, through the real CLI or the Python API."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import raymtl
from raymtl.algorithms.fedavg import FedAvg
from raymtl.cli import app
from raymtl.config import ConfigError
from raymtl.errors import StepFailed
from tests.conftest import digits_experiment

ROOT = Path(__file__).resolve().parents[2]
BARS = str(ROOT / "examples" / "own_data" / "my_data.py")  # 4 classes

# A plugin file per case (each module imported once per test session: its names stay its own).
PLUGINS = {
    "ue_settings.py": """
        from raymtl.extend import FedAvg, LocalTrainingParams, register_algorithm

        class SettingsParams(LocalTrainingParams):
            beta: float = 0.5

        @register_algorithm
        class RefusesSomeSettings(FedAvg):
            name = "ue_refuses_some_settings"
            Params = SettingsParams

            def __init__(self, params, model_factory):
                super().__init__(params, model_factory)
                if params.beta > 1:
                    raise ValueError("beta above 1 is not supported")
        """,
    "ue_always.py": """
        from raymtl.extend import FedAvg, register_algorithm

        @register_algorithm
        class AlwaysRaises(FedAvg):
            name = "ue_always_raises"

            def __init__(self, params, model_factory):
                raise RuntimeError("not written yet")
        """,
    "ue_params.py": """
        from pydantic import model_validator
        from raymtl.extend import FedAvg, LocalTrainingParams, register_algorithm

        class CheckedParams(LocalTrainingParams):
            gamma: float = 0.0

            @model_validator(mode="after")
            def _gamma_known(self):
                if self.gamma > 1:
                    return {"small": 0.0}["large"]
                return self

        @register_algorithm
        class ParamsRaise(FedAvg):
            name = "ue_params_raise"
            Params = CheckedParams
        """,
    "ue_on_hosts.py": """
        from raymtl.extend import FedAvg, register_algorithm

        @register_algorithm
        class RaisesOnHosts(FedAvg):
            name = "ue_raises_on_hosts"

            def __init__(self, params, model_factory):
                super().__init__(params, model_factory)
                if model_factory is not None:  # a host's: the model its clients train
                    self.width = model_factory("client/0", 10).hidden_width
        """,
    "ue_step.py": """
        from raymtl.extend import FedAvg, register_algorithm

        @register_algorithm
        class StepRaises(FedAvg):
            name = "ue_step_raises"

            def train(self, state, inbox, ctx):
                return state, {"ok": []}["control_variate"]
        """,
    "ue_hook.py": """
        from raymtl.extend import FedAvg, register_algorithm

        @register_algorithm
        class HookRaises(FedAvg):
            name = "ue_hook_raises"

            def merge(self, state, average):
                raise ValueError("merge is not written yet")
        """,
    "ue_heads.py": """
        from torch import nn
        from raymtl.extend import FedModel, register_model

        @register_model
        class FixedHead(FedModel):
            name = "ue_fixed_head"
            description = "a head of `outputs` values, whatever num_classes is"

            def __init__(self, input_shape, num_classes, outputs: int = 2):
                channels, height, width = input_shape
                flat = nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, 8))
                super().__init__(flat, nn.Linear(8, outputs), 8)
        """,
}


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("plugins")
    for name, source in PLUGINS.items():
        (folder / name).write_text(textwrap.dedent(source))
    return folder


def experiment(tmp_path, plugins: Path, plugin: str, **overrides) -> Path:
    """A small digits experiment (6 clients, 2 rounds) with one plugin, as a YAML file."""
    raw = digits_experiment(tmp_path / "runs", **overrides)
    raw["plugins"] = [str(plugins / plugin), *raw.get("plugins", [])]
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def one_line(result, exit_code: int) -> str:
    """The one error line of a command that ended with `exit_code` (never a traceback)."""
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    return line


def run_dirs(tmp_path) -> list[Path]:
    return sorted((tmp_path / "runs").glob("test-*"))


def test_a_constructor_refusing_some_settings_names_the_class_and_settings(tmp_path, plugins):
    path = experiment(
        tmp_path,
        plugins,
        "ue_settings.py",
        **{"algorithm.name": "ue_refuses_some_settings", "algorithm.params.beta": 2.0},
    )
    line = one_line(CliRunner().invoke(app, ["run", str(path)]), 2)
    assert line.startswith("error: algorithm.params: RefusesSomeSettings(")
    assert "beta=2.0" in line and "raised ValueError: beta above 1 is not supported" in line
    assert f"{plugins / 'ue_settings.py'}:15" in line  # the plugin's file and the raise's line
    assert run_dirs(tmp_path) == []  # refused before the run directory is made


def test_a_constructor_that_always_raises_is_no_import_error(tmp_path, plugins):
    plugin = str(plugins / "ue_always.py")
    listed = CliRunner().invoke(app, ["list", "--plugin", plugin])
    assert listed.exit_code == 0 and "ue_always_raises" in listed.output  # it imports
    path = experiment(tmp_path, plugins, "ue_always.py", **{"algorithm.name": "ue_always_raises"})
    line = one_line(CliRunner().invoke(app, ["run", str(path)]), 2)
    assert "could not be imported" not in line
    assert "AlwaysRaises(epochs=1, lr=0.1) raised RuntimeError: not written yet" in line
    assert f"algorithm ue_always_raises, {plugin}:9" in line
    assert run_dirs(tmp_path) == []


def test_params_raising_names_the_class_and_settings(tmp_path, plugins):
    path = experiment(
        tmp_path,
        plugins,
        "ue_params.py",
        **{"algorithm.name": "ue_params_raise", "algorithm.params.gamma": 2},
    )
    line = one_line(CliRunner().invoke(app, ["run", str(path)]), 2)
    assert "algorithm.params: ParamsRaise.Params(" in line and "gamma=2" in line
    assert (
        f"raised KeyError: 'large' (algorithm ue_params_raise, {plugins}/ue_params.py:11)" in line
    )
    assert run_dirs(tmp_path) == []


@pytest.mark.parametrize("executor", ["inline", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_constructor_raising_on_the_hosts_is_one_line(request, tmp_path, plugins, executor):
    """The driver builds the algorithm without a model factory, so only the hosts meet this
    error: inline, and in a Ray actor, whose RayTaskError is reduced to the host's line."""
    if executor == "ray":
        request.getfixturevalue("ray_session")
    path = experiment(
        tmp_path,
        plugins,
        "ue_on_hosts.py",
        **{
            "algorithm.name": "ue_raises_on_hosts",
            "runtime.executor": executor,
            "runtime.clients_per_actor": 6,
        },
    )
    line = one_line(CliRunner().invoke(app, ["run", str(path)]), 2)
    assert line.startswith("error: host clients-0: algorithm.params: RaisesOnHosts(")
    assert "raised AttributeError: 'CNNMnist' object has no attribute 'hidden_width'" in line
    assert f"{plugins}/ue_on_hosts.py:11" in line
    (run_dir,) = run_dirs(tmp_path)  # made before the hosts: no round ran, nothing marked
    assert not (run_dir / "FAILED").exists() and not (run_dir / "summary.json").exists()


def bars_experiment(tmp_path, plugins, outputs: int, executor: str) -> Path:
    raw = {
        "name": "bars",
        "plugins": [BARS, str(plugins / "ue_heads.py")],
        "data": {"name": "bars", "num_clients": 4, "partition": {"kind": "iid"}},
        "model": {"name": "ue_fixed_head", "params": {"outputs": outputs}},
        "algorithm": {"name": "fedavg", "params": {"epochs": 1}},
        "rounds": 2,
        "seeds": [0],
        "runtime": {"executor": executor},
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }
    path = tmp_path / "bars.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_model_with_fewer_outputs_than_classes_is_refused_before_any_actor(
    ray_session, tmp_path, plugins
):
    """2 outputs on 4 classes failed in round 1's loss ('Target 3 is out of bounds')."""
    actors = sorted(a["name"] for a in ray_session.util.list_named_actors(all_namespaces=True))
    path = bars_experiment(tmp_path, plugins, outputs=2, executor="ray")
    line = one_line(CliRunner().invoke(app, ["run", str(path)]), 2)
    assert line.startswith(
        f"error: model.name: 'ue_fixed_head' (FixedHead, {plugins}/ue_heads.py) outputs 2 "
        "values per sample, but task 'label' has 4 classes"
    )
    assert "gave (2, 2)" in line
    assert not (tmp_path / "runs").exists()  # no run directory
    now = sorted(a["name"] for a in ray_session.util.list_named_actors(all_namespaces=True))
    assert now == actors  # no actor started


def test_a_model_with_more_outputs_than_classes_is_refused_from_python(tmp_path, plugins):
    """10 outputs on 4 classes used to train without a word."""
    path = bars_experiment(tmp_path, plugins, outputs=10, executor="inline")
    with pytest.raises(ConfigError) as refused:
        raymtl.run(str(path))
    (line,) = str(refused.value).splitlines()
    assert "'ue_fixed_head'" in line and "outputs 10 values per sample" in line
    assert "has 4 classes: its head must output num_classes (4) values" in line
    assert not (tmp_path / "runs").exists()


def failed_run(tmp_path, line: str, step_file: str) -> Path:
    """The one run directory, marked FAILED with the line; run.log holds the step's whole
    traceback. The command's line ends with the command that goes on once it is fixed."""
    (run_dir,) = run_dirs(tmp_path)
    logged = f"; the traceback is in {run_dir / 'run.log'}"
    if line.startswith("error: "):  # the command's
        assert line.endswith(
            f"{logged}; once the code is fixed, `raymtl run --resume {run_dir}` goes on from "
            "the last complete checkpoint"
        )
    else:  # raymtl.StepFailed's
        assert line.endswith(logged)
    assert (run_dir / "FAILED").read_text().strip() in line
    log = (run_dir / "run.log").read_text()
    assert "Traceback (most recent call last)" in log and step_file in log
    assert not (run_dir / "summary.json").exists()
    assert not (run_dir / "checkpoints" / "seed0" / "DONE").exists()
    return run_dir


@pytest.mark.parametrize("executor", ["inline", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_step_that_raises_is_one_line_and_marks_the_run_failed(
    request, tmp_path, plugins, executor
):
    if executor == "ray":
        request.getfixturevalue("ray_session")
    step_file = str(plugins / "ue_step.py")
    path = experiment(
        tmp_path,
        plugins,
        "ue_step.py",
        **{
            "algorithm.name": "ue_step_raises",
            "runtime.executor": executor,
            "runtime.clients_per_actor": 6,
        },
    )
    line = one_line(CliRunner().invoke(app, ["run", str(path)]), 1)
    assert line.startswith(
        "error: algorithm ue_step_raises: StepRaises.train raised KeyError: "
        f"'control_variate' ({step_file}:9; client/0, seed 0, round 1)"
    )
    run_dir = failed_run(tmp_path, line, step_file)
    reported = CliRunner().invoke(app, ["report", str(run_dir)])
    assert reported.exit_code == 0
    assert reported.stderr.strip().startswith("this run failed: algorithm ue_step_raises:")
    assert f"`raymtl run --resume {run_dir}` goes on" in reported.stderr


def test_a_failed_run_goes_on_once_the_step_is_fixed(tmp_path, plugins, monkeypatch):
    path = experiment(tmp_path, plugins, "ue_step.py", **{"algorithm.name": "ue_step_raises"})
    line = one_line(CliRunner().invoke(app, ["run", str(path)]), 1)
    run_dir = failed_run(tmp_path, line, str(plugins / "ue_step.py"))
    from raymtl.algorithms.registry import get_algorithm

    monkeypatch.setattr(get_algorithm("ue_step_raises"), "train", FedAvg.train)  # the fix
    resumed = CliRunner().invoke(app, ["run", "--resume", str(run_dir)])
    assert resumed.exit_code == 0, resumed.output
    assert not (run_dir / "FAILED").exists() and (run_dir / "summary.json").is_file()
    assert "KeyError: 'control_variate'" in (run_dir / "run.log").read_text()  # kept


def test_a_hook_that_raises_inside_an_inherited_step_is_named_with_the_step(tmp_path, plugins):
    """HookRaises(FedAvg)'s `merge` raises inside FedAvg's `aggregate`: the line names the
    step as called and the plugin's function that raised, and ends with the command that
    goes on once it is fixed, which does."""
    hook_file = str(plugins / "ue_hook.py")
    path = experiment(tmp_path, plugins, "ue_hook.py", **{"algorithm.name": "ue_hook_raises"})
    result = CliRunner().invoke(app, ["run", str(path)])
    line = one_line(result, 1)
    assert result.stdout == ""  # the error line alone: no bar was drawn, no empty line
    assert line.startswith(
        f"error: algorithm ue_hook_raises: HookRaises.aggregate (in HookRaises.merge, "
        f"{hook_file}:9) raised ValueError: merge is not written yet (server, seed 0, round 1)"
    )
    run_dir = failed_run(tmp_path, line, hook_file)
    command = line.rpartition("`raymtl ")[2].partition("`")[0].split()
    assert command == ["run", "--resume", str(run_dir)]
    from raymtl.algorithms.registry import get_algorithm

    hooked = get_algorithm("ue_hook_raises")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hooked, "merge", FedAvg.merge)  # the fix
        resumed = CliRunner().invoke(app, command)
    assert resumed.exit_code == 0, resumed.output
    assert not (run_dir / "FAILED").exists() and (run_dir / "summary.json").is_file()


def test_too_many_clients_for_the_data_names_data_num_clients(tmp_path):
    """The partition refuses 5000 clients on 1797 digits: the line names the field as the
    file and the override give it, data.num_clients (not the partition's own name)."""
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(digits_experiment(tmp_path / "runs")))
    result = CliRunner().invoke(app, ["run", str(path), "data.num_clients=5000"])
    line = one_line(result, 2)
    assert line.startswith("error: data.num_clients: 5000 clients exceed the "), line
    assert result.stdout == ""


def test_a_built_in_algorithms_bug_names_the_algorithm_and_step(tmp_path, monkeypatch):
    def aggregate(self, state, inbox, ctx):
        return state, [1 / len([])]

    monkeypatch.setattr(FedAvg, "aggregate", aggregate)
    with pytest.raises(StepFailed) as failed:
        raymtl.run(digits_experiment(tmp_path / "runs"))
    (line,) = str(failed.value).splitlines()
    assert line.startswith(
        "algorithm fedavg: FedAvg.aggregate raised ZeroDivisionError: division by zero ("
    )
    assert "; server, seed 0, round 1); the traceback is in " in line
    failed_run(tmp_path, line, __file__)


@pytest.mark.ray
def test_an_explicit_layout_that_cannot_fit_is_one_line(ray_session, tmp_path):
    """6 clients, 2 a client actor of 1 CPU each, on the 2-CPU Ray: 3 actors for room for 2,
    refused before any actor starts, with no traceback of actors that never started."""
    raw = digits_experiment(
        tmp_path / "runs",
        **{
            "runtime.executor": "ray",
            "runtime.clients_per_actor": 2,
            "runtime.num_cpus_per_actor": 1,
        },
    )
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(path)])
    line = one_line(result, 2)
    assert line.startswith("error: runtime.clients_per_actor: 2 makes 3 client actors of 1 CPU")
    assert "room for 2" in line
    assert "Unhandled error" not in result.output
    (run_dir,) = run_dirs(tmp_path)  # made before Ray: its config.yaml alone, nothing marked
    assert [p.name for p in run_dir.iterdir()] == ["config.yaml"]
