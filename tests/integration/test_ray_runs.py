"""End to end on one shared local Ray: the CLI, the object store, resume, parity."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from raymtl.cli import app
from raymtl.runtime import resume_experiment, run_experiment
from raymtl.runtime.router import Envelope
from tests.conftest import write_experiment

pytestmark = pytest.mark.ray

OUTPUTS = ["config.yaml", "clients.parquet", "rounds.parquet", "messages.parquet", "summary.json"]
PLOTS = ["accuracy_vs_round.png", "accuracy_vs_bits.png", "client_accuracy_distribution.png"]
# Every algorithm runs (finite metrics, exact bits) in tests/integration/test_all_algorithms.py;
# here one run goes through the CLI on Ray and writes every output and plot.
ALGORITHMS = {"fedavg": {}}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_raymtl_run_writes_every_output(ray_session, tmp_path, algorithm):
    path = write_experiment(tmp_path, **{"algorithm.name": algorithm, **ALGORITHMS[algorithm]})
    result = CliRunner().invoke(
        app, ["run", str(path), "runtime.executor=ray", "output.plots=true"]
    )
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("test-")]
    for name in OUTPUTS:
        assert (run_dir / name).is_file(), name
    for name in PLOTS:
        assert (run_dir / "plots" / name).stat().st_size > 0, name
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert sorted(clients["client"].unique()) == list(range(6))
    assert list(pd.read_parquet(run_dir / "rounds.parquet")["round"]) == [1, 2]
    assert algorithm in result.output  # the results table


def contains_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(contains_tensor(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, dict):
        return any(contains_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(contains_tensor(v) for v in value)
    return False


def envelopes_in(value) -> list[Envelope]:
    if isinstance(value, Envelope):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a PhaseResult
        return [e for f in dataclasses.fields(value) for e in envelopes_in(getattr(value, f.name))]
    if isinstance(value, list | tuple):
        return [e for item in value for e in envelopes_in(item)]
    return []


@pytest.mark.parametrize("algorithm", ["fedavg", "dpsgd"])
def test_no_model_tensor_reaches_the_driver(ray_session, make_config, monkeypatch, algorithm):
    """Everything the driver ray.get()s is metadata; payloads stay ObjectRefs."""
    seen = []
    real_get = ray_session.get

    def recording_get(refs, *args, **kwargs):
        value = real_get(refs, *args, **kwargs)
        seen.append(value)
        return value

    monkeypatch.setattr(ray_session, "get", recording_get)
    cfg = make_config(**{"algorithm.name": algorithm, "runtime.executor": "ray"})
    run_experiment(cfg)
    assert seen, "the driver made no ray.get at all"
    assert not any(contains_tensor(value) for value in seen)
    envelopes = [e for value in seen for e in envelopes_in(value)]
    assert envelopes and all(isinstance(e.payload, ray_session.ObjectRef) for e in envelopes)


def final_clients(run_dir) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "clients.parquet")
    return frame.sort_values(["seed", "round", "client"]).reset_index(drop=True)


def test_resume_reproduces_the_uninterrupted_run(ray_session, make_config, tmp_path):
    settings = {"runtime.executor": "ray", "rounds": 4, "checkpoint_every": 2, "seeds": [0, 1]}
    whole = run_experiment(make_config(**settings), tmp_path / "whole")
    # Crash after round 3 of seed 0: round 3 is lost, the round-2 checkpoint is complete.
    broken = run_experiment(make_config(**settings), tmp_path / "broken", stop_after=3)
    assert (broken / "checkpoints" / "seed0" / "round00002" / "COMPLETE").is_file()
    resumed = resume_experiment(broken)
    columns = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]
    pd.testing.assert_frame_equal(final_clients(whole)[columns], final_clients(resumed)[columns])
    rounds = pd.read_parquet(resumed / "rounds.parquet")
    assert len(rounds) == 8 and (resumed / "summary.json").is_file()


# The papers' algorithms too: SFMTL-Graph's graph step and one-shot HFL's clustering run in
# the GraphActor on Ray and in-process inline; results must not depend on where.
PARITY = {
    "fedavg": {},
    "ditto": {},
    "per_fedavg": {"algorithm.params": {"alpha": 0.05, "beta": 0.1}},
    "fedrep": {"algorithm.params": {"head_epochs": 2, "sample_fraction": 0.5}},
    "fedprox": {"algorithm.params": {"mu": 0.1, "straggler_fraction": 0.5}},
    "ifca": {"algorithm.params": {"epochs": 1, "clusters": 3, "sample_fraction": 0.5}},
    "dpsgd": {},
    "sfmtl_graph": {"algorithm.params": {"epochs": 1}},
    "oneshot_hfl": {"topology.kind": "hierarchical", "topology.num_lps": 2},
    # public set, server-side tuples and the clients' Muscle steps
    "fedmuscle": {
        "data.public": {"size": 100},
        "algorithm.params": {"public_batch": 8, "partners": 2, "dim": 16, "contrastive_steps": 2},
    },
}


@pytest.mark.parametrize("algorithm", sorted(PARITY))
def test_inline_and_ray_executors_agree_exactly(ray_session, make_config, tmp_path, algorithm):
    settings = {"algorithm.name": algorithm, "rounds": 3, **PARITY[algorithm]}
    inline = run_experiment(
        make_config(**settings, **{"runtime.executor": "inline"}), tmp_path / "inline"
    )
    remote = run_experiment(
        make_config(**settings, **{"runtime.executor": "ray"}), tmp_path / "ray"
    )
    columns = ["round", "client", "loss", "accuracy", "samples", "bits_up", "bits_down"]
    pd.testing.assert_frame_equal(final_clients(inline)[columns], final_clients(remote)[columns])
