"""Plugins as a user runs them: by path and by module name, whole runs inline, and
`raymtl list --plugin`."""

from __future__ import annotations

import pandas as pd
import yaml
from typer.testing import CliRunner

from raymtl import plugins
from raymtl.cli import app
from raymtl.config import load_config, parse_config
from raymtl.graph import build_topology
from tests.conftest import digits_experiment
from tests.unit.test_plugins import (  # noqa: F401  (registries_restored: autouse fixture)
    plugin_experiment,
    registries_restored,
    write_plugin,
)


def test_a_plugin_by_path_registers_everything_and_runs_inline(tmp_path, monkeypatch):
    from raymtl.runtime import run_experiment

    # A relative path is looked up next to the experiment file, then kept absolute.
    plugin = write_plugin(tmp_path / "project", "my_plugin", "_p")
    experiment = tmp_path / "project" / "experiment.yaml"
    experiment.write_text(yaml.safe_dump(plugin_experiment(tmp_path, "my_plugin.py", "_p")))
    monkeypatch.chdir(tmp_path)  # not the experiment's folder: the path resolves next to it
    cfg = load_config(experiment)
    assert cfg.plugins == [str(plugin.resolve())]
    assert cfg.algorithm.typed_params().beta == 0.25
    assert cfg.data.partition.params == {"shift": 2}
    assert plugins.search_paths()[-1] == str(plugin.parent.resolve())

    run_dir = run_experiment(cfg)
    clients = pd.read_parquet(f"{run_dir}/clients.parquet")
    rounds = pd.read_parquet(f"{run_dir}/rounds.parquet")
    assert sorted(rounds["round"].unique()) == [1, 2]
    assert set(clients["client"].unique()) == set(range(6))
    evaluated = clients.dropna(subset=["mse"])
    assert len(evaluated) > 0 and (evaluated["mse"] >= 0).all() and (evaluated["mae"] >= 0).all()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["plugins"] == cfg.plugins


def test_a_plugin_by_module_name_and_its_topology(tmp_path, monkeypatch):
    from raymtl.runtime import run_experiment

    folder = tmp_path / "site"
    write_plugin(folder, "user_plugin_m", "_m")
    monkeypatch.syspath_prepend(str(folder))
    raw = digits_experiment(
        tmp_path,
        **{
            "algorithm.name": "dpsgd",
            "topology.kind": "line_m",
            "topology.params": {"closed": True},
            "model.name": "tiny_net_m",
        },
    )
    cfg = parse_config({"plugins": ["user_plugin_m"], **raw})
    assert cfg.plugins == ["user_plugin_m"] and cfg.shape() == "peer"
    assert str(folder) in plugins.search_paths()
    ring = build_topology("line_m", 6, 0, closed=True)
    assert sorted(dict(ring.degree).values()) == [2] * 6

    run_dir = run_experiment(cfg)
    rounds = pd.read_parquet(f"{run_dir}/rounds.parquet")
    assert sorted(rounds["round"].unique()) == [1, 2]
    assert rounds["mean_accuracy"].between(0, 1).all()


def test_raymtl_list_marks_plugin_entries_and_refuses_a_broken_plugin(tmp_path):
    from raymtl.api import catalogue

    path = write_plugin(tmp_path, "listed", "_l")
    result = CliRunner().invoke(app, ["list", "--plugin", str(path)])
    assert result.exit_code == 0, result.output
    for name in ("shrink_fedavg_l", "tiny_net_l", "blobs_l", "pairs_l", "line_l"):
        assert name in result.output, name
    rows = {
        row[0]: row[1:]
        for rows in (
            catalogue.algorithm_rows(),
            catalogue.model_rows(),
            catalogue.source_rows(),
            catalogue.partition_rows(),
            catalogue.topology_rows(),
            catalogue.task_rows(),
        )
        for row in rows
    }
    mine = ("shrink_fedavg_l", "tiny_net_l", "blobs_l", "pairs_l", "line_l", "brightness_l")
    assert all(rows[name][0].endswith("(plugin listed.py)") for name in mine)
    assert not rows["fedavg"][0].endswith(")") and "plugin" not in rows["digits"][0]
    assert "beta: float=0.5 (>=0, <=1)" in rows["shrink_fedavg_l"][1]
    assert rows["tiny_net_l"][1] == "width: int=6"
    assert rows["blobs_l"][1] == "num_samples: int=240"
    assert rows["pairs_l"][1] == "params.shift: int=1"
    assert rows["line_l"][1] == "closed: bool=False"
    assert rows["brightness_l"][1].startswith("loss mse; metrics mse, mae")

    missing = CliRunner().invoke(app, ["list", "--plugin", "no_such_plugin_module"])
    assert missing.exit_code == 2
    lines = [line for line in missing.output.splitlines() if line.strip()]
    assert lines == [
        "error: plugins: 'no_such_plugin_module' could not be imported: "
        "ModuleNotFoundError: No module named 'no_such_plugin_module'"
    ]
