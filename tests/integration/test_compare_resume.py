"""An interrupted comparison goes on (`raymtl.compare(resume=...)`, `raymtl compare --resume`):
finished experiments are kept, the interrupted one resumes from its last complete
checkpoint, the rest start, and the table is the uninterrupted comparison's; `raymtl report`
re-draws a comparison as it does a run (inline)."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

import raymtl
from raymtl.cli import app
from tests.conftest import digits_experiment, learned

ARMS = ["algorithm.name=fedavg,local,ditto"]


class Started(raymtl.Callback):
    """Records the experiments that started, in order."""

    def __init__(self):
        self.current = None
        self.started: list[str] = []

    def on_run_start(self, config, run_dir) -> None:
        self.current = config.name
        self.started.append(config.name)


class CtrlCAt(Started):
    """Interrupts the comparison, as Ctrl-C would, once `experiment`'s `seed` has done `round`."""

    def __init__(self, experiment: str, seed: int, round_index: int):
        super().__init__()
        self.at = (experiment, seed, round_index)

    def on_round_end(self, event) -> None:
        if (self.current, event.seed, event.round) == self.at:
            raise KeyboardInterrupt


def test_an_interrupted_comparison_goes_on_to_the_uninterrupted_table(tmp_path):
    raw = digits_experiment(tmp_path, rounds=3, seeds=[0, 1], checkpoint_every=1)
    whole = raymtl.compare([raw], ARMS, out=tmp_path / "whole")

    cut = tmp_path / "cut"
    ctrl_c = CtrlCAt("test-local", seed=1, round_index=2)
    with pytest.raises(KeyboardInterrupt):
        raymtl.compare([raw], ARMS, out=cut, callbacks=[ctrl_c])
    assert ctrl_c.started == ["test-fedavg", "test-local"]  # ditto never started
    assert (cut / "test-fedavg" / "summary.json").is_file()
    assert not (cut / "test-local" / "summary.json").exists()
    assert not (cut / "table.csv").exists()

    went_on = Started()
    resumed = raymtl.compare(resume=cut, callbacks=[went_on])
    assert went_on.started == ["test-fedavg", "test-local", "test-ditto"]
    pd.testing.assert_frame_equal(learned(resumed.table), learned(whole.table))
    for name in ("test-fedavg", "test-local", "test-ditto"):
        for table in ("clients", "rounds"):
            ours = pd.read_parquet(cut / name / f"{table}.parquet")
            theirs = pd.read_parquet(tmp_path / "whole" / name / f"{table}.parquet")
            pd.testing.assert_frame_equal(learned(ours), learned(theirs))
    # seed 1 of test-local went on from its round-2 checkpoint: round 3 ran once more only
    rounds = pd.read_parquet(cut / "test-local" / "rounds.parquet")
    assert rounds[["seed", "round"]].values.tolist() == [[s, r] for s in (0, 1) for r in (1, 2, 3)]

    # A finished comparison resumed again is only tabulated; from the command line too.
    result = CliRunner().invoke(app, ["compare", "--resume", str(cut)])
    assert result.exit_code == 0, result.output
    pd.testing.assert_frame_equal(
        learned(pd.read_csv(cut / "table.csv")),
        learned(pd.read_csv(tmp_path / "whole" / "table.csv")),
    )

    # `raymtl report` re-draws a comparison from its runs' Parquet files: the same table.csv,
    # also for a comparison made before comparison.yaml was written (its summary.json order)
    written = (cut / "table.csv").read_text()
    (cut / "table.csv").unlink()
    (cut / "comparison.yaml").unlink()
    result = CliRunner().invoke(app, ["report", str(cut)])
    assert result.exit_code == 0, result.output
    assert (cut / "table.csv").read_text() == written
    result = CliRunner().invoke(app, ["report", str(tmp_path / "whole" / "test-local")])
    assert result.exit_code == 0 and "Results:" in result.output  # a run, as before


def test_what_a_comparison_resume_refuses_is_one_line(tmp_path):
    raw = digits_experiment(tmp_path, rounds=1)
    with pytest.raises(raymtl.ConfigError, match=r"^--resume: '.*' has no comparison.yaml"):
        raymtl.compare(resume=tmp_path)
    with pytest.raises(raymtl.ConfigError, match=r"^--resume: give only the comparison folder"):
        raymtl.compare([raw], resume=tmp_path)
    result = CliRunner().invoke(app, ["compare"])
    assert result.exit_code == 2 and "give experiment files (or --resume" in result.output
    result = CliRunner().invoke(app, ["report", str(tmp_path)])  # neither a run nor a comparison
    assert result.exit_code == 2 and "nor a comparison's comparison.yaml" in result.output
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "comparison.yaml").write_text("- not a plan\n")
    result = CliRunner().invoke(app, ["compare", "--resume", str(tmp_path / "bad")])
    assert result.exit_code == 2 and "not a comparison plan raymtl wrote" in result.output
