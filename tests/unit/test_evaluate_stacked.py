"""Clients with their own weights of one architecture, evaluated together, score as alone.

`evaluate_stacked` (vmapped over stacked weights for small models, a functional call per
client for large ones) against `evaluate_task` per client; the host's `_evaluate_own`
against the per-client evaluation it replaces; `materialize_many` against `materialize`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import raymtl.tasks.objectives as objectives
from raymtl.data.client_data import materialize, materialize_many
from raymtl.data.shards import ClientShard
from raymtl.data.source_registry import Pool
from raymtl.flops import FlopMeter
from raymtl.models.registry import build_model, num_params
from raymtl.tasks.objectives import evaluate_stacked, evaluate_task
from raymtl.tasks.spec import TaskSpec


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def assert_same_metrics(mine: list[dict], reference: list[dict]) -> None:
    assert len(mine) == len(reference)
    for got, expected in zip(mine, reference, strict=True):
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            if name == "accuracy":
                assert got[name] == value
            else:
                torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7)


def test_two_linear_clients_by_hand():
    """Client 0: logits = x (identity); client 1: logits = -x. Hand-computed CE."""
    skeleton = nn.Linear(2, 2, bias=False)
    identity = {"weight": torch.eye(2)}
    flipped = {"weight": -torch.eye(2)}
    x = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 0])
    results = evaluate_stacked(skeleton, [identity, flipped], [(x, y, None), (x, y, None)])
    # Client 0: rows (2, 0) -> class 0 right, CE log(1 + e^-2); (0, 1) -> wrong, log(1 + e).
    loss_0 = (math.log1p(math.exp(-2)) + math.log1p(math.exp(1))) / 2
    # Client 1: rows (-2, 0) -> wrong, log(1 + e^2); (0, -1) -> right, log(1 + e^-1).
    loss_1 = (math.log1p(math.exp(2)) + math.log1p(math.exp(-1))) / 2
    assert results[0]["accuracy"] == 0.5 and results[1]["accuracy"] == 0.5
    assert results[0]["loss"] == pytest.approx(loss_0, rel=1e-6)
    assert results[1]["loss"] == pytest.approx(loss_1, rel=1e-6)


@pytest.mark.parametrize("stack", [True, False], ids=["vmapped", "one_by_one"])
@pytest.mark.parametrize("name", ["mlp", "cnn_mnist"])
def test_own_weights_together_equal_each_alone(name, stack, monkeypatch):
    # STACK_BYTES decides between the two paths; both are checked on both models.
    monkeypatch.setattr(objectives, "STACK_BYTES", float("inf") if stack else 0)
    torch.manual_seed(0)
    sizes = [1, 7, 0, 600, 3, 1, 40]  # one over a batch of 512, one with no test sample
    models = [build_model(name, (1, 28, 28), 10).eval() for _ in sizes]
    tests = [(torch.rand(n, 1, 28, 28), torch.randint(0, 10, (n,)), None) for n in sizes]
    together = evaluate_stacked(models[0], [weights_of(m) for m in models], tests, max_clients=4)
    alone = [evaluate_task(m, x, y, task) for m, (x, y, task) in zip(models, tests, strict=True)]
    assert_same_metrics(together, alone)


def test_channels_last_pass_leaves_the_model_and_its_outputs_alone():
    torch.manual_seed(0)
    model = build_model("cnn_mnist", (1, 28, 28), 10).eval()
    before = {name: (t.clone(), t.stride()) for name, t in model.state_dict().items()}
    x = torch.rand(300, 1, 28, 28)
    forward = objectives.faster_forward(model, x)
    assert forward is not model  # images on the CPU: the NHWC pass
    # However few the samples: the choice is the model's and the device's, never the host's.
    assert objectives.faster_forward(model, x[:1]) is not model
    with torch.no_grad():
        torch.testing.assert_close(forward(x), model(x), rtol=1e-5, atol=1e-6)
        assert torch.equal(forward(x).argmax(1), model(x).argmax(1))
    for name, t in model.state_dict().items():
        assert torch.equal(t, before[name][0]) and t.stride() == before[name][1]
    # Its FLOPs are counted as the NCHW pass's (one batch of 300 against 128 + 128 + 44).
    tests = [(x, torch.randint(0, 10, (300,)), None)]
    counts = []
    for batch in (512, 128):
        with FlopMeter().passes() as counted:
            objectives.evaluate_together(model, tests, batch)
        counts.append(counted.flops)
    assert counts[0] == counts[1] > 0


class NormedHead(nn.Module):
    """BatchNorm (running statistics in eval mode) and Dropout (off in eval mode)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(4)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.dropout(self.norm(x)))


def test_batchnorm_uses_each_clients_running_statistics():
    torch.manual_seed(0)
    models = []
    for _ in range(5):
        model = NormedHead()
        model.norm.running_mean.normal_()
        model.norm.running_var.uniform_(0.5, 2.0)
        models.append(model.eval())
    tests = [(torch.randn(n, 4), torch.randint(0, 3, (n,)), None) for n in (3, 1, 8, 2, 5)]
    weights = [weights_of(m) for m in models]
    together = evaluate_stacked(NormedHead(), weights, tests)  # a fresh module: its own
    alone = [evaluate_task(m, x, y, task) for m, (x, y, task) in zip(models, tests, strict=True)]
    assert_same_metrics(together, alone)
    # Eval mode throughout: the running statistics were read, never updated.
    for model, kept in zip(models, weights, strict=True):
        torch.testing.assert_close(model.norm.running_mean, kept["norm.running_mean"])


def test_other_losses_scored_per_client():
    torch.manual_seed(0)
    attributes = TaskSpec(name="attributes", loss="bce")
    regression = TaskSpec(name="landmarks", loss="mse")
    models = [nn.Linear(4, 3) for _ in range(3)]
    tests = [
        (torch.randn(5, 4), (torch.rand(5, 3) > 0.5).float(), attributes),
        (torch.randn(6, 4), torch.randn(6, 3), regression),
        (torch.randn(2, 4), torch.tensor([0, 2]), None),
    ]
    together = evaluate_stacked(models[0], [weights_of(m) for m in models], tests)
    alone = [evaluate_task(m, x, y, task) for m, (x, y, task) in zip(models, tests, strict=True)]
    assert_same_metrics(together, alone)


def test_materialize_many_is_bit_identical():
    generator = torch.Generator().manual_seed(0)
    pool = Pool(
        x=torch.randint(0, 256, (200, 1, 8, 8), dtype=torch.uint8, generator=generator),
        y=torch.randint(0, 4, (200,), generator=generator),
        num_classes=4,
        class_names=("a", "b", "c", "d"),
        scale=255.0,
        source="synthetic",
    )
    rng = np.random.default_rng(0)
    shards = []
    for client in range(12):
        labels = (client % 2, 2 + client % 2)  # relabelled to 2 classes
        mine = np.flatnonzero(np.isin(pool.y.numpy(), labels))
        picked = rng.choice(mine, size=3 + client % 4, replace=False)
        shards.append(
            ClientShard(
                client_id=client,
                train_idx=picked[:-1],
                test_idx=picked[-1:],
                group=client % 3,
                rotation=90 * (client % 3),
                mask_prob=0.3 if client % 5 == 0 else 0.0,  # masked ones: one by one
                task=0,
                task_classes=labels if client % 4 else None,
            )
        )
    # The decode itself, by hand: the first client's test sample scaled, rotated by 90°.
    reference = pool.x[shards[1].test_idx].float() / 255.0
    reference = torch.rot90(reference, k=1, dims=(-2, -1))
    assert torch.equal(materialize_many(pool, shards[1:2], 7)[0].test_x, reference)
    for input_shape in (None, (1, 12, 12)):  # 8x8 samples resized to 12x12 in the second
        together = materialize_many(pool, shards, 7, None, input_shape)
        for shard, data in zip(shards, together, strict=True):
            alone = materialize(pool, shard, 7, None, input_shape)
            for field in ("train_x", "train_y", "test_x", "test_y"):
                assert torch.equal(getattr(data, field), getattr(alone, field)), field
            assert (data.num_classes, data.input_shape) == (alone.num_classes, alone.input_shape)


def evaluate_one_by_one(self, participants: list[str]) -> list[dict]:
    """The host's evaluation of clients with their own weights before they were stacked."""
    rows = []
    for participant in participants:
        state = self.clients.evaluation_state(participant)
        with self.flops.passes() as counted:
            model = self.algorithm.eval_model(state)
            metrics = evaluate_task(model, state.data.test_x, state.data.test_y, state.data.task)
        rows.append(self._row(participant, state.data, metrics, num_params(model), counted.flops))
    return rows
