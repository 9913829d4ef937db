"""The command line as a user meets it: errors, list, compare, report (InlineExecutor)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pandas as pd
from typer.testing import CliRunner

from raymtl.cli import app
from tests.conftest import as_typed_at_a_terminal
from tests.conftest import write_experiment as write


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    path = write(tmp_path, **{"data.partition.classes_per_client": 11})
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "classes_per_client" in lines[0], result.stderr


def test_fedavg_on_clients_with_different_tasks_is_refused_in_one_line(tmp_path):
    tasks = [
        {"name": "attributes", "targets": "attributes", "clients": 3},
        {"name": "landmarks", "targets": "landmarks", "clients": 3},
    ]
    path = write(tmp_path, **{"data.partition": {"kind": "iid"}, "data.tasks": tasks})
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert "algorithm.name: fedavg averages whole models" in line and "colnet" in line


def test_ctrl_c_names_the_command_that_goes_on_and_that_command_finishes_the_run(tmp_path):
    """The suite's one run of the real console command in a process of its own: a Ctrl-C
    from the terminal, its one line, and the command it prints finishing the run."""
    path = write(tmp_path, rounds=40, checkpoint_every=1)
    run = subprocess.Popen(
        [sys.executable, "-m", "raymtl", "run", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_typed_at_a_terminal,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("test-*/checkpoints/seed0/round00002/COMPLETE")):
        assert run.poll() is None and time.monotonic() < deadline, "no round 2 checkpoint"
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130 and "Traceback" not in err
    (run_dir,) = tmp_path.glob("test-*")
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted (test seed 0 round ")
    assert line.endswith(
        f"`raymtl run --resume {run_dir}` goes on from the last complete checkpoint"
    )
    result = CliRunner().invoke(app, ["run", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert pd.read_parquet(run_dir / "rounds.parquet")["round"].tolist() == list(range(1, 41))


def test_unknown_key_and_override_errors(tmp_path):
    runner = CliRunner()
    path = write(tmp_path)
    result = runner.invoke(app, ["run", str(path), "model.widht=3"])
    assert result.exit_code == 2 and "model.widht: unknown key" in result.output
    result = runner.invoke(app, ["run", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not list(tmp_path.glob("test-*")), "no run directory for a rejected experiment"


def test_missing_dataset_is_a_clear_error(tmp_path):
    path = write(tmp_path, **{"data.name": "cifar10", "data.root": str(tmp_path / "none")})
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "data.root" in result.output and "download" in result.output
    assert not list(tmp_path.glob("test-*")), "checked before a run directory is made"


def test_list_shows_every_registry():
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0
    for name in (
        "fedavg",
        "dpsgd",
        "hfedavg",
        "local",
        "digits",
        "fashion_mnist",
        "dirichlet",
        "task_groups",
        "cnn_mnist",
        "resnet18",
        "erdos_renyi",
        "watts_strogatz",
    ):
        assert name in result.output, name


def test_compare_fans_out_and_report_redraws(tmp_path):
    path = write(tmp_path, **{"output.plots": True})
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        app, ["compare", str(path), "algorithm.name=fedavg,local", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    summaries = json.loads((out / "summary.json").read_text())
    assert [s["algorithm"] for s in summaries] == ["test-fedavg", "test-local"]
    table = pd.read_csv(out / "table.csv")
    assert list(table["experiment"]) == ["test-fedavg", "test-local"]
    assert table.loc[1, "total_bits_mean"] == 0  # Local sends nothing
    assert list((out / "plots").glob("*.png"))
    run_dir = out / "test-fedavg"
    (run_dir / "summary.json").unlink()
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0 and (run_dir / "summary.json").is_file()
    assert (run_dir / "plots" / "accuracy_vs_round.png").is_file()


def test_output_plots_false_draws_no_plot_and_report_draws_them(tmp_path):
    result = CliRunner().invoke(app, ["run", str(write(tmp_path)), "rounds=1"])
    assert result.exit_code == 0, result.output
    (run_dir,) = tmp_path.glob("test-*")
    assert (run_dir / "summary.json").is_file() and (run_dir / "rounds.parquet").is_file()
    assert not (run_dir / "plots").exists() and "plot:" not in result.output
    assert "Results:" in result.output and f"results in {run_dir}" in result.output
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0 and (run_dir / "plots" / "accuracy_vs_round.png").is_file()


def test_compare_refuses_different_data(tmp_path):
    first = write(tmp_path, "a.yaml")
    second = write(tmp_path, "b.yaml", **{"data.num_clients": 5, "name": "other"})
    result = CliRunner().invoke(app, ["compare", str(first), str(second)])
    assert result.exit_code == 2 and "data: 'other' differs" in result.output


def test_bad_model_parameter_fails_before_any_actor(tmp_path):
    path = write(tmp_path, **{"model.params": {"hidden": 3}})
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2 and "model.params.hidden: not a parameter" in result.output


def test_resume_from_the_command_line(make_config, tmp_path):
    from raymtl.runtime import run_experiment

    cfg = make_config(**{"rounds": 3, "checkpoint_every": 1})
    run_dir = run_experiment(cfg, tmp_path / "run", stop_after=2)
    assert not (run_dir / "summary.json").exists()
    result = CliRunner().invoke(app, ["run", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert list(rounds["round"]) == [1, 2, 3]
    assert (run_dir / "summary.json").is_file()
    result = CliRunner().invoke(app, ["run", "--resume", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "config.yaml" in result.output


def test_the_start_up_line_follows_a_run_and_never_a_resume(make_config, tmp_path, monkeypatch):
    """The line speaks of the command's own start: a resumed run's startup table begins with
    its first command's, so `--resume` prints none (the line's cases: test_start_up_hint)."""
    from raymtl import cli
    from raymtl.runtime import run_experiment

    monkeypatch.setattr(cli, "start_up_hint", lambda config, startup: "start-up: slow")
    result = CliRunner().invoke(app, ["run", str(write(tmp_path))])
    assert result.exit_code == 0 and result.output.rstrip().endswith("start-up: slow")
    run_dir = run_experiment(make_config(rounds=2), tmp_path / "run", stop_after=1)
    result = CliRunner().invoke(app, ["run", "--resume", str(run_dir)])
    assert result.exit_code == 0 and "start-up" not in result.output, result.output
