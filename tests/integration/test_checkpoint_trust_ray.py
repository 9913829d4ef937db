"""A damaged checkpoint under the Ray executor: the actor that reads it raises, the driver
finds the DamagedCheckpoint behind Ray's wrapper, names the file in one line and falls back
to the previous checkpoint; no host counts as lost and the replayed round equals the one
first run."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from raymtl.config import parse_config
from raymtl.runtime import resume_experiment, run_experiment
from tests.conftest import digits_experiment

pytestmark = pytest.mark.ray

SETTINGS = {
    "algorithm.name": "pfedme",
    "rounds": 3,
    "checkpoint_every": 1,
    "runtime.executor": "ray",
}
COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]


def clients(run_dir) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "clients.parquet")
    return frame.sort_values(["seed", "round", "client"]).reset_index(drop=True)[COLUMNS]


@pytest.mark.slow
@pytest.mark.cluster
def test_a_damaged_file_read_by_an_actor_falls_back_to_the_previous_checkpoint(
    ray_session, tmp_path, caplog
):
    cfg = parse_config(digits_experiment(tmp_path, **SETTINGS))
    run_dir = run_experiment(cfg, tmp_path / "run", stop_after=2)  # checkpoints 1 and 2
    first_pass = clients(run_dir)
    target = run_dir / "checkpoints" / "seed0" / "round00002" / "client_0.pt"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x10]))
    with caplog.at_level(logging.WARNING):
        resume_experiment(run_dir)
    (line,) = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert line.startswith(f"seed 0: checkpoint file {target} is damaged (")
    assert line.endswith("; falling back to round 1")
    assert not (run_dir / "faults.parquet").exists()  # no host was lost
    # Round 2, replayed from round 1's checkpoint, equals the round 2 first run.
    resumed = clients(run_dir)
    pd.testing.assert_frame_equal(first_pass, resumed[resumed["round"] <= 2])
    assert resumed["round"].max() == 3
