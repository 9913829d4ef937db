"""What a user types that must not hurt: bad overrides, settings, paths and experiment files
(empty, binary) are one line and exit 2; --resume keeps the run's settings (only rounds may
grow), never drops an override and refuses a config.yaml edited after its checkpoints; the
final round is checkpointed, so a longer run replays nothing; the Python API runs and loads a
run. InlineExecutor: no Ray needed."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import raymtl
from raymtl.cli import app
from raymtl.config import ConfigError
from tests.conftest import write_experiment as write

BAD_OVERRIDES = {
    "rounds=[1,": "rounds: '[1,' is not a YAML value",
    "algorithm.params.lr=.inf": "algorithm.params.lr: Input should be a finite number",
    "data.partition.alpha=.nan": "data.partition.alpha: Input should be a finite number",
    "name=../../x": "name: '../../x' may hold only letters",
}


def one_line_exit_2(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("override", sorted(BAD_OVERRIDES))
def test_a_bad_override_is_one_line(tmp_path, override):
    result = CliRunner().invoke(app, ["run", str(write(tmp_path)), override])
    one_line_exit_2(result, BAD_OVERRIDES[override])
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # no run directory left behind


def test_an_unwritable_output_dir_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(app, ["run", str(write(tmp_path)), f"output.dir={blocker}/runs"])
    one_line_exit_2(result, "output.dir: cannot create")


def test_compare_takes_a_list_as_one_value_and_never_writes_into_a_used_directory(tmp_path):
    path = write(tmp_path, **{"rounds": 1, "data.partition.kind": "iid"})
    out = tmp_path / "cmp"
    args = ["compare", str(path), "data.partition.rotations=[0,90]", "algorithm.name=fedavg,local"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load((out / "test-local" / "config.yaml").read_text())
    assert config["data"]["partition"]["rotations"] == [0, 90]
    again = CliRunner().invoke(app, [*args, "--out", str(out)])
    one_line_exit_2(again, "--out: ")


def interrupted(tmp_path, **overrides):
    """A 3-round run stopped after round 2 (round-2 checkpoint complete)."""
    from raymtl.config import load_config
    from raymtl.runtime import run_experiment

    path = write(tmp_path, **{"rounds": 3, "checkpoint_every": 1, **overrides})
    return run_experiment(load_config(path), tmp_path / "run", stop_after=2)


def test_resume_refuses_a_changed_setting_in_one_line(tmp_path):
    run_dir = interrupted(tmp_path)
    result = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "algorithm.params.lr=0.5"])
    one_line_exit_2(result, "algorithm.params.lr: 0.1 in the run, 0.5 now; --resume keeps")
    fewer = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "rounds=1"])
    one_line_exit_2(fewer, "rounds: 1 < 3 of the run")


def test_resume_applies_more_rounds_even_after_the_run_finished(tmp_path):
    run_dir = interrupted(tmp_path)
    result = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "rounds=4"])
    assert result.exit_code == 0, result.output
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert rounds["round"].tolist() == [1, 2, 3, 4]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["rounds"] == 4
    longer = raymtl.resume(run_dir, overrides=["rounds=5"])  # a finished run goes on too
    assert longer.rounds["round"].tolist() == [1, 2, 3, 4, 5]


def test_the_python_api_runs_and_loads_results(tmp_path):
    run_dir = raymtl.run(write(tmp_path), overrides=["rounds=1", "output.plots=false"]).run_dir
    assert run_dir.is_absolute() and run_dir.parent == tmp_path
    results = raymtl.load_results(run_dir)
    assert results.config.rounds == 1 and list(results.rounds["round"]) == [1]
    assert set(results.clients["client"]) == set(range(6)) and not results.messages.empty
    last = results.rounds["mean_accuracy"].iloc[-1]  # the summary is the last round's figure
    assert results.summary["final"]["mean_accuracy"]["mean"] == pytest.approx(last)
    with pytest.raises(ConfigError, match="has no config.yaml"):
        raymtl.load_results(tmp_path)


def test_rejected_non_finite_updates_reach_the_console_and_a_table(tmp_path, caplog):
    """Every update rejected, both rounds: each in warnings.parquet; on the console one line
    for the seed (not one a round, nor the step's own line besides); the summary names the
    seed and the round its training diverged from."""
    results = raymtl.run(write(tmp_path), overrides=["algorithm.params.lr=1e12"])
    warnings = pd.read_parquet(results.run_dir / "warnings.parquet")
    assert set(warnings["participant"]) == {"server"} and len(warnings) == 2 * 6
    assert warnings["message"].str.contains("non-finite update").all()
    driver = [r.getMessage() for r in caplog.records if r.name == "raymtl.runtime.loop.round_loop"]
    (line,) = [line for line in driver if "non-finite" in line]
    assert "seed 0 round 1, server: rejected a non-finite update (not aggregated) (x6;" in line
    assert not [r for r in caplog.records if r.name.startswith("raymtl.algorithms")]
    (entry,) = results.summary["diverged"]
    assert (entry["seed"], entry["round"], entry["updates_rejected"]) == (0, 1, 12)


def test_bf16_mixed_precision_trains_like_fp32_and_is_recorded(tmp_path):
    """Clients train and evaluate under bfloat16 autocast; the run learns as fp32 does."""
    settings = ["rounds=4", "data.partition.kind=iid", "data.partition.rotations=null"]
    settings += ["algorithm.params.epochs=3", "algorithm.params.lr=0.5"]
    fp32 = raymtl.run(write(tmp_path, "a.yaml"), overrides=settings)
    bf16 = raymtl.run(
        write(tmp_path, "b.yaml"), overrides=[*settings, "runtime.precision=bf16-mixed"]
    )
    assert bf16.config.runtime.precision == "bf16-mixed"
    first, last = bf16.rounds["mean_loss"].iloc[0], bf16.rounds["mean_loss"].iloc[-1]
    assert last < first - 0.2  # it learns (a cached bf16 weight copy would freeze it)
    # Tracks fp32: the loss (accuracy on ~60 test samples moves in steps of 1/60 and is noisy).
    assert abs(last - fp32.rounds["mean_loss"].iloc[-1]) < 0.05


def test_rounds_say_where_the_seconds_went_and_the_summary_the_throughput(tmp_path):
    results = raymtl.run(write(tmp_path), overrides=["rounds=2"])
    rounds = results.rounds
    assert rounds["clients_trained"].tolist() == [6, 6]  # FedAvg: every client trains
    for kind in ("seconds_train", "seconds_aggregate", "seconds_evaluate"):
        assert (rounds[kind] > 0).all(), kind
    assert (rounds["seconds_receive"] == 0).all()  # FedAvg's clients have no other step
    assert (rounds["seconds_train"] + rounds["seconds_aggregate"] < rounds["wall_time"]).all()
    phases = results.tables["phases"]
    steps = phases.groupby("round")["step"].apply(list).tolist()
    assert steps == [["broadcast", "train", "aggregate"]] * 2
    throughput = results.summary["final"]["client_updates_per_second"]["mean"]
    assert throughput == pytest.approx(12 / rounds["wall_time"].iloc[-1])


def test_a_config_yaml_edited_after_its_checkpoints_is_refused_naming_the_field(tmp_path):
    run_dir = interrupted(tmp_path)
    saved = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(saved.replace("lr: 0.1", "lr: 0.5"))
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    result = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "rounds=8"])
    one_line_exit_2(
        result,
        "algorithm.params.lr: 0.1 in the checkpoints, 0.5 now (checkpoints/seed0/round00002); "
        "--resume needs the settings its checkpoints were written with",
    )
    # Refused before anything ran or changed: no round, no rewritten config.yaml.
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    assert pd.read_parquet(run_dir / "rounds.parquet")["round"].tolist() == [1, 2]
    assert "rounds: 3" in (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(saved)  # restored: the run goes on
    result = CliRunner().invoke(app, ["run", "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output


class Rounds(raymtl.Callback):
    def __init__(self):
        self.seen = []

    def on_round_end(self, event):
        self.seen.append(event.round)


def test_the_final_round_is_checkpointed_so_a_longer_run_replays_nothing(tmp_path):
    path = write(tmp_path, **{"rounds": 6, "checkpoint_every": 2})
    run_dir = raymtl.run(path).run_dir
    seed_dir = run_dir / "checkpoints" / "seed0"
    complete = sorted(p.parent.name for p in seed_dir.glob("round*/COMPLETE"))
    assert complete == ["round00002", "round00004", "round00006"]
    rounds = Rounds()
    longer = raymtl.resume(run_dir, overrides=["rounds=8"], callbacks=[rounds])
    assert rounds.seen == [7, 8]  # from round 6's checkpoint: nothing run twice
    assert longer.rounds["round"].tolist() == list(range(1, 9))
    assert (seed_dir / "round00008" / "COMPLETE").is_file()


def test_a_seed_stopped_by_a_callback_is_checkpointed_where_it_stopped(tmp_path):
    class StopAt3(Rounds):
        def on_round_end(self, event):
            super().on_round_end(event)
            return event.round == 3

    path = write(tmp_path, **{"rounds": 6, "checkpoint_every": 2})
    run_dir = raymtl.run(path, callbacks=[StopAt3()]).run_dir
    assert (run_dir / "checkpoints" / "seed0" / "round00003" / "COMPLETE").is_file()
    rounds = Rounds()
    raymtl.resume(run_dir, overrides=["rounds=7"], callbacks=[rounds])
    assert rounds.seen == [4, 5, 6, 7]


BAD_INPUTS = {
    "runtime.clients_per_actor=0": "runtime.clients_per_actor: 0 clients an actor; give 'auto'",
    "runtime.memory_budget=-1": "runtime.memory_budget: -1 is not a positive size",
    "runtime.memory_budget=0GB": "runtime.memory_budget: '0GB' is not a positive size",
}


@pytest.mark.parametrize("override", sorted(BAD_INPUTS))
def test_a_bad_runtime_setting_is_one_line(tmp_path, override):
    result = CliRunner().invoke(app, ["run", str(write(tmp_path)), override])
    one_line_exit_2(result, BAD_INPUTS[override])


BAD_FILES = {
    "empty": (b"", "is empty (it holds no settings)"),
    "only comments": (b"# an experiment, one day\n", "is empty (it holds no settings)"),
    "an empty mapping": (b"{}\n", "is empty (it holds no settings)"),
    "binary": (bytes(range(256)), "is not a text file (UTF-8 YAML)"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_an_empty_or_binary_experiment_file_is_refused_in_one_line(tmp_path, kind):
    content, problem = BAD_FILES[kind]
    path = tmp_path / "experiment.yaml"
    path.write_bytes(content)
    result = CliRunner().invoke(app, ["run", str(path)])
    one_line_exit_2(result, f"experiment file: '{path}' {problem}")
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # nothing ran


def test_a_memory_budget_refusal_is_its_one_line_without_the_estimate_before_it(tmp_path):
    path = write(
        tmp_path,
        **{
            "algorithm.name": "sheaf_fmtl",
            "topology.kind": "erdos_renyi",
            "topology.params": {"p": 0.5},
            "runtime.memory_budget": "10KB",
        },
    )
    result = CliRunner().invoke(app, ["run", str(path)])
    one_line_exit_2(result, "runtime.memory_budget: sheaf_fmtl needs")
    assert "per-client state needs" not in result.output


def test_a_damaged_config_yaml_is_refused_in_one_line(tmp_path):
    run_dir = interrupted(tmp_path)
    (run_dir / "config.yaml").write_bytes(bytes(range(256)))
    result = CliRunner().invoke(app, ["run", "--resume", str(run_dir)])
    one_line_exit_2(result, f"--resume: {run_dir / 'config.yaml'} is not a config raymtl wrote")


def test_a_federation_reopening_an_edited_run_directory_is_refused(tmp_path):
    from raymtl.api.federation import Federation
    from tests.conftest import digits_experiment

    run_dir = interrupted(tmp_path)
    saved = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(saved.replace("lr: 0.1", "lr: 0.5"))
    edited = digits_experiment(tmp_path, **{"rounds": 3, "algorithm.params.lr": 0.5})
    with pytest.raises(ConfigError, match=r"^algorithm.params.lr: 0.1 in the checkpoints, 0.5"):
        Federation(edited, run_dir=run_dir)
