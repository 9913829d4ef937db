"""FedMuscle end to end on one shared local Ray: three architectures and two tasks align on a
public set; only public-batch indices and representations travel, never a model or a sample."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from raymtl.config import parse_config
from raymtl.runtime import resume_experiment, run_experiment
from tests.conftest import digits_experiment

pytestmark = pytest.mark.ray

B, M, D = 8, 2, 16
MODELS = ["mlp", "small_cnn", "resnet8", "mlp", "small_cnn", "resnet8"]
TASKS = [
    {"name": "classes", "targets": "label", "clients": 4},
    {"name": "attributes", "targets": "attributes", "clients": 2},
]


def muscle(tmp_path, **overrides):
    settings = {
        "algorithm.name": "fedmuscle",
        "algorithm.params": {"public_batch": B, "partners": M, "dim": D, "contrastive_steps": 2},
        "data.partition": {"kind": "iid", "max_samples_per_client": 60},
        "data.tasks": TASKS,
        "data.public": {"size": 100},
        "model.clients": MODELS,
        "runtime.executor": "ray",
        **overrides,
    }
    return parse_config(digits_experiment(tmp_path, **settings))


def test_three_architectures_and_two_tasks_exchange_only_representations(ray_session, tmp_path):
    run_dir = run_experiment(muscle(tmp_path, **{"output.plots": True}), tmp_path / "run")
    for name in ("config.yaml", "clients.parquet", "rounds.parquet", "alignment.parquet"):
        assert (run_dir / name).is_file(), name
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["public"]["size"] == 100
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert set(clients["model"]) == {"mlp", "small_cnn", "resnet8"}
    assert set(clients["task_name"]) == {"classes", "attributes"}
    messages = pd.read_parquet(run_dir / "messages.parquet")
    bits = {"public_batch": B * 64, "representations": B * D * 32, "tuples": B**M * (D + 1) * 32}
    assert set(messages["kind"]) == set(bits)  # no model, no map, no sample ever travels
    for kind, size in bits.items():
        assert (messages.loc[messages["kind"] == kind, "bits"] == size).all(), kind
    per_round = messages.groupby(["round", "kind"]).size().unstack()
    assert (per_round == 6 * 2).all().all()  # every client, every one of the T = 2 steps
    alignment = pd.read_parquet(run_dir / "alignment.parquet")
    assert len(alignment) == 2 * 6 * 2 and alignment["loss"].gt(0).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["tasks"]) == {"classes", "attributes"}
    assert (run_dir / "plots" / "tasks.png").is_file()


def test_a_resumed_run_reproduces_the_uninterrupted_one(ray_session, tmp_path):
    settings = {"runtime.executor": "inline", "rounds": 3, "checkpoint_every": 1}
    whole = run_experiment(muscle(tmp_path, **settings), tmp_path / "whole")
    broken = run_experiment(muscle(tmp_path, **settings), tmp_path / "broken", stop_after=2)
    resumed = resume_experiment(broken)
    columns = ["seed", "round", "client", "loss", "accuracy", "f1", "bits_up", "bits_down"]

    def final(run_dir):
        frame = pd.read_parquet(run_dir / "clients.parquet")
        return frame.sort_values(["seed", "round", "client"]).reset_index(drop=True)[columns]

    pd.testing.assert_frame_equal(final(whole), final(resumed))
