"""Evaluating clients that share a model together equals evaluating them one by one."""

from __future__ import annotations

import torch

from raymtl.models.registry import build_model
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
