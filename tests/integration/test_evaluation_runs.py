"""Whole runs evaluated together, with own weights, and on any layout of hosts: the client
rows equal the one-by-one evaluation's."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from raymtl.runtime.hosts.host import ParticipantHost
from tests.unit.test_evaluate_stacked import evaluate_one_by_one


@pytest.mark.parametrize(
    ("algorithm", "model"),
    [("local", "mlp"), ("local", "cnn_mnist"), ("ditto", "mlp")],
)
def test_a_run_with_own_weights_records_the_same_client_rows(
    algorithm, model, tmp_path: Path, monkeypatch
):
    import raymtl

    overrides = [
        "rounds=2",
        "seeds=[0]",
        "runtime.executor=inline",
        "output.plots=false",
        f"algorithm.name={algorithm}",
        f"model.name={model}",
    ]
    if algorithm == "ditto":
        overrides += ["topology.kind=star", "algorithm.params={epochs: 1, lr: 0.05}"]
    chunks = []
    evaluate_chunk = ParticipantHost._evaluate_stacked

    def counting(self, members):
        chunks.append(len(members))
        return evaluate_chunk(self, members)

    monkeypatch.setattr(ParticipantHost, "_evaluate_stacked", counting)
    stacked = raymtl.run(
        "jobs/local_digits.yaml", overrides=[*overrides, f"output.dir={tmp_path}/a"]
    )
    assert chunks and max(chunks) > 1  # clients of one architecture went together
    monkeypatch.setattr(ParticipantHost, "_evaluate_own", evaluate_one_by_one)
    alone = raymtl.run("jobs/local_digits.yaml", overrides=[*overrides, f"output.dir={tmp_path}/b"])
    columns = ["round", "client", "accuracy", "samples", "test_samples", "model_params"]
    pd.testing.assert_frame_equal(stacked.clients[columns], alone.clients[columns])
    pd.testing.assert_series_equal(stacked.clients["loss"], alone.clients["loss"], rtol=1e-6)
    assert stacked.rounds["flops_evaluate"].tolist() == alone.rounds["flops_evaluate"].tolist()


def test_a_run_evaluated_together_records_the_same_client_rows(tmp_path: Path, monkeypatch):
    import raymtl

    overrides = [
        "rounds=2",
        "seeds=[0]",
        "runtime.executor=inline",
        "output.plots=false",
        "algorithm.params.sample_fraction=0.5",  # the others get an evaluation copy
    ]
    groups = []
    evaluate_group = ParticipantHost._evaluate_group

    def counting(self, group):
        groups.append(len(group))
        return evaluate_group(self, group)

    monkeypatch.setattr(ParticipantHost, "_evaluate_group", counting)
    grouped = raymtl.run(
        "jobs/fedavg_digits.yaml", overrides=[*overrides, f"output.dir={tmp_path}/a"]
    )
    assert groups and max(groups) == 20  # one model: every client of the host at once
    monkeypatch.setattr(
        ParticipantHost, "_together", lambda self, participants: [[p] for p in participants]
    )
    alone = raymtl.run(
        "jobs/fedavg_digits.yaml", overrides=[*overrides, f"output.dir={tmp_path}/b"]
    )
    columns = ["round", "client", "accuracy", "samples", "test_samples", "bits_down"]
    pd.testing.assert_frame_equal(grouped.clients[columns], alone.clients[columns])
    pd.testing.assert_series_equal(grouped.clients["loss"], alone.clients["loss"], rtol=1e-6)
    assert grouped.rounds["flops_evaluate"].tolist() == alone.rounds["flops_evaluate"].tolist()


def test_a_run_records_the_same_client_rows_whatever_the_hosts_hold(tmp_path):
    """FedAvg, 21 clients on hosts of 5 (the last holds 1), of 10 (the last holds 1: a
    client evaluated with the global model but alone on its host) and all on one host."""
    import raymtl

    overrides = ["rounds=1", "seeds=[0]", "runtime.executor=inline", "output.plots=false"]
    overrides += ["data.num_clients=21"]
    frames = {}
    for per_host in ("5", "10", "auto"):
        layout = [f"runtime.clients_per_actor={per_host}", f"output.dir={tmp_path}/{per_host}"]
        results = raymtl.run("jobs/fedavg_digits.yaml", overrides=[*overrides, *layout])
        frames[per_host] = results.clients.sort_values("client").reset_index(drop=True)
    columns = ["client", "loss", "accuracy", "test_samples"]
    for per_host in ("5", "10"):  # rtol=0, atol=0: bitwise
        pd.testing.assert_frame_equal(
            frames[per_host][columns], frames["auto"][columns], check_exact=True
        )
