"""Checkpoints a user can trust: every file is checked against the sha256 its manifest
(COMPLETE) recorded before torch reads it. A damaged, truncated, empty or foreign file (and a
planted pickle: it never runs) is named in one line, the run falls back to the previous
complete checkpoint and its results equal the uninterrupted run's; with no checkpoint to fall
back to it is refused in one line. Checkpoints written before manifests had checksums still
load. Inline executor: no Ray needed."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pandas as pd
import pytest
import torch

from raymtl.config import ConfigError, parse_config
from raymtl.runtime import resume_experiment, run_experiment
from tests.conftest import digits_experiment

# pFedMe: the server keeps the global model, each client its θ̃ (a file per client that took
# part, listed in its host's index): every kind of checkpoint file.
SETTINGS = {"algorithm.name": "pfedme", "rounds": 4, "checkpoint_every": 1}
CLIENT_COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]


class Planted:
    """An object whose unpickling would create a file (stands for arbitrary code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the uninterrupted 4-round run, the same run stopped after round 3)."""
    tmp_path = tmp_path_factory.mktemp("runs")
    cfg = parse_config(digits_experiment(tmp_path, **SETTINGS))
    whole = run_experiment(cfg, tmp_path / "whole")
    broken = run_experiment(cfg, tmp_path / "broken", stop_after=3)
    return whole, broken


def copy_of(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "run")


def clients(run_dir) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "clients.parquet")
    return frame.sort_values(["seed", "round", "client"]).reset_index(drop=True)[CLIENT_COLUMNS]


def flip_a_bit(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]


def planted(tmp_path) -> bytes:
    path = tmp_path / "planted.pt"
    torch.save({"model": None, "extras": {"x": Planted(tmp_path / "code-ran")}}, path)
    return path.read_bytes()


DAMAGE = {
    "bit flipped": ("client_0.pt", lambda data, tmp_path: flip_a_bit(data)),
    "truncated": ("server.pt", lambda data, tmp_path: data[: len(data) // 2]),
    "empty": ("client_3.pt", lambda data, tmp_path: b""),
    "random bytes": ("server.pt", lambda data, tmp_path: bytes(range(256)) * 8),
    "planted pickle": ("client_0.pt", lambda data, tmp_path: planted(tmp_path)),
    "damaged index": ("index-client_0.json", lambda data, tmp_path: b'["client/0", "cl'),
    "damaged manifest": ("COMPLETE", lambda data, tmp_path: data[:40]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_file_is_named_and_the_run_falls_back_to_the_previous_checkpoint(
    runs, tmp_path, caplog, damage
):
    whole, broken = runs
    run_dir = copy_of(broken, tmp_path)
    name, damaged = DAMAGE[damage]
    round3 = run_dir / "checkpoints" / "seed0" / "round00003"
    target = round3 / name
    target.write_bytes(damaged(target.read_bytes(), tmp_path))
    with caplog.at_level(logging.WARNING):
        resume_experiment(run_dir)
    # One line names the file; the run fell back to round 2, never counting a lost host.
    (line,) = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert line.startswith(f"seed 0: checkpoint file {target} ")
    assert line.endswith("; falling back to round 2") and "\n" not in line
    assert "weights_only" not in caplog.text and "Traceback" not in caplog.text
    assert not (run_dir / "faults.parquet").exists()
    assert not (tmp_path / "code-ran").exists()  # the planted pickle never ran
    pd.testing.assert_frame_equal(clients(whole), clients(run_dir))
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert rounds["round"].tolist() == [1, 2, 3, 4]
    # Round 3 was written again, over the damaged one: complete, verified, unmarked.
    assert not (round3 / "DAMAGED").exists()
    complete = json.loads((round3 / "COMPLETE").read_text())
    assert complete["round"] == 3 and "server.pt" in complete["files"]


@pytest.mark.parametrize(
    ("file", "damage", "problem"),
    [
        (
            "client_0.pt",
            flip_a_bit,
            r"is damaged \(\d+ bytes; its sha256 differs from the one COMPLETE",
        ),
        ("COMPLETE", lambda data: data[:40], "is not the manifest raymtl wrote"),
    ],
)
def test_a_damaged_checkpoint_with_none_before_it_is_refused_in_one_line(
    tmp_path, file, damage, problem
):
    cfg = parse_config(digits_experiment(tmp_path, **{**SETTINGS, "checkpoint_every": 2}))
    run_dir = run_experiment(cfg, tmp_path / "run", stop_after=3)  # round 2's checkpoint only
    target = run_dir / "checkpoints" / "seed0" / "round00002" / file
    target.write_bytes(damage(target.read_bytes()))
    for _ in range(2):  # and again: a refused checkpoint is neither marked nor skipped later
        with pytest.raises(ConfigError) as refused:
            resume_experiment(run_dir)
        message = str(refused.value)
        assert len(message.splitlines()) == 1
        assert message.startswith(f"checkpoint file {target} ") and re.search(problem, message)
        assert message.endswith(
            "; seed 0 has no earlier complete checkpoint to fall back to (move "
            "checkpoints/seed0 aside to run the seed from its start)"
        )
    assert not (target.parent / "DAMAGED").exists()


def old_manifest(round_dir) -> None:
    """COMPLETE as raymtl wrote it before manifests had checksums and the config."""
    complete = json.loads((round_dir / "COMPLETE").read_text())
    (round_dir / "COMPLETE").write_text(json.dumps({"round": complete["round"], "lost": []}))


def test_checkpoints_written_before_checksums_still_load(runs, tmp_path):
    whole, broken = runs
    run_dir = copy_of(broken, tmp_path)
    for round_dir in (run_dir / "checkpoints" / "seed0").glob("round*"):
        old_manifest(round_dir)
    resume_experiment(run_dir)
    pd.testing.assert_frame_equal(clients(whole), clients(run_dir))


def test_a_planted_pickle_under_an_old_manifest_is_refused_unread(runs, tmp_path, caplog):
    """No checksum to catch it: torch's weights-only load refuses it, and the line says so
    without torch's advice to load it unsafely."""
    whole, broken = runs
    run_dir = copy_of(broken, tmp_path)
    round3 = run_dir / "checkpoints" / "seed0" / "round00003"
    old_manifest(round3)
    (round3 / "server.pt").write_bytes(planted(tmp_path))
    with caplog.at_level(logging.WARNING):
        resume_experiment(run_dir)
    (line,) = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert line == (
        f"seed 0: checkpoint file {round3 / 'server.pt'} holds objects other than tensors and "
        "plain data (refused unread); falling back to round 2"
    )
    assert "weights_only" not in caplog.text
    assert not (tmp_path / "code-ran").exists()
    pd.testing.assert_frame_equal(clients(whole), clients(run_dir))
