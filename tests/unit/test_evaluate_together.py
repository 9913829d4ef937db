"""Evaluating clients that share a model together equals evaluating them one by one."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from raymtl.models.registry import build_model
from raymtl.runtime.hosts.host import ParticipantHost
from raymtl.tasks.objectives import evaluate_task, evaluate_together
from raymtl.tasks.spec import TaskSpec


def test_each_client_gets_what_evaluate_task_gives_it():
    torch.manual_seed(0)
    model = build_model("cnn_mnist", (1, 28, 28), 10)
    sizes = [1, 7, 0, 600, 3]  # one client over a batch of 512, one with no test sample
    tests = [(torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)), None) for n in sizes]
    together = evaluate_together(model, tests)
    alone = [evaluate_task(model, x, y, task) for x, y, task in tests]
    for mine, reference in zip(together, alone, strict=True):
        assert mine.keys() == reference.keys()
        assert mine["accuracy"] == reference["accuracy"]
        torch.testing.assert_close(mine["loss"], reference["loss"], rtol=1e-6, atol=1e-7)


def test_clients_of_different_tasks_share_the_forward_but_not_the_metrics():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    attributes = TaskSpec(name="attributes", loss="bce")
    regression = TaskSpec(name="landmarks", loss="mse")
    tests = [
        (torch.randn(5, 4), (torch.rand(5, 3) > 0.5).float(), attributes),
        (torch.randn(6, 4), torch.randn(6, 3), regression),
        (torch.randn(2, 4), torch.tensor([0, 2]), None),
    ]
    together = evaluate_together(model, tests)
    for mine, (x, y, task) in zip(together, tests, strict=True):
        reference = evaluate_task(model, x, y, task)
        assert mine.keys() == reference.keys()
        for name, value in reference.items():
            torch.testing.assert_close(mine[name], value, rtol=1e-6, atol=1e-7)


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
