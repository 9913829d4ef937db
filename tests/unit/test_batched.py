"""Batched local SGD (torch.func, vmap over clients) against the serial `local_sgd`."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from raymtl.algorithms.base import LocalTrainingParams
from raymtl.algorithms.batched import can_batch, local_sgd_batched
from raymtl.algorithms.training import local_sgd
from raymtl.models import build_model
from raymtl.tasks.spec import OptimizerSpec, TaskSpec

SHAPE = (1, 8, 8)
CLASSES = 5
CLIENTS = 3
SAMPLES = 20  # batch_size 8: batches of 8, 8, 4
PARAMS = LocalTrainingParams(
    epochs=2, lr=0.05, batch_size=8, momentum=0.9, weight_decay=1e-4, clip_grad=1.0
)
SEEDS = [11, 22, 33]


def make_models(name: str, count: int = CLIENTS, outputs: int = CLASSES) -> list:
    models = []
    for index in range(count):
        torch.manual_seed(100 + index)  # a different initialisation per client
        models.append(build_model(name, SHAPE, outputs))
    return models


def make_data(samples: int = SAMPLES, count: int = CLIENTS, targets: str = "label") -> list:
    generator = torch.Generator().manual_seed(0)
    datas = []
    for _ in range(count):
        x = torch.randn(samples, *SHAPE, generator=generator)
        if targets == "label":
            y = torch.randint(0, CLASSES, (samples,), generator=generator)
        else:
            y = torch.randn(samples, CLASSES, generator=generator)
        datas.append(SimpleNamespace(train_x=x, train_y=y))
    return datas


def train_both(models, datas, params, tasks):
    """(serial models, serial losses, batched models, batched losses) from the same start."""
    serial = [copy.deepcopy(model) for model in models]
    serial_losses = [
        local_sgd(model, data.train_x, data.train_y, params, seed, task=task)
        for model, data, seed, task in zip(serial, datas, SEEDS, tasks, strict=True)
    ]
    batched = [copy.deepcopy(model) for model in models]
    xs, ys = [d.train_x for d in datas], [d.train_y for d in datas]
    batched_losses = local_sgd_batched(batched, xs, ys, params, SEEDS, tasks)
    return serial, serial_losses, batched, batched_losses


def assert_same_training(serial, serial_losses, batched, batched_losses) -> None:
    assert batched_losses == pytest.approx(serial_losses, abs=1e-5)
    for one, other in zip(serial, batched, strict=True):
        for (name, expected), (_, actual) in zip(
            one.state_dict().items(), other.state_dict().items(), strict=True
        ):
            torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "large_cnn"])
@pytest.mark.parametrize("clip_grad", [1.0, 0.05])
def test_batched_matches_serial(name: str, clip_grad: float) -> None:
    models, datas, tasks = make_models(name), make_data(), [None] * CLIENTS
    params = PARAMS.model_copy(update={"clip_grad": clip_grad})
    assert can_batch(models, datas, params, tasks)
    serial, serial_losses, batched, batched_losses = train_both(models, datas, params, tasks)
    assert_same_training(serial, serial_losses, batched, batched_losses)
    # The models did train (and differently per client).
    start, end = models[0].state_dict(), batched[0].state_dict()
    assert any(not torch.equal(start[key], end[key]) for key in start)
    assert len({round(loss, 6) for loss in batched_losses}) == CLIENTS


def test_batched_plain_sgd_without_clipping() -> None:
    models, datas, tasks = make_models("mlp"), make_data(), [None] * CLIENTS
    params = LocalTrainingParams(epochs=1, lr=0.1, batch_size=6)
    assert_same_training(*train_both(models, datas, params, tasks))


def test_batched_task_optimizer_and_mse_loss() -> None:
    spec = OptimizerSpec("sgd", lr=0.02, momentum=0.5, weight_decay=1e-3)
    task = TaskSpec("landmarks", "landmarks", "mse", CLASSES, optimizer=spec, metrics=("mse",))
    models, datas, tasks = make_models("mlp"), make_data(targets="landmarks"), [task] * CLIENTS
    assert can_batch(models, datas, PARAMS, tasks)
    assert_same_training(*train_both(models, datas, PARAMS, tasks))


def test_parameters_the_loss_never_reaches_stay_untouched() -> None:
    models = make_models("mlp")
    for model in models:
        model.add_representation(4)  # projection.*: in parameters(), never in forward
    datas, tasks = make_data(), [None] * CLIENTS
    assert can_batch(models, datas, PARAMS, tasks)
    serial, serial_losses, batched, batched_losses = train_both(models, datas, PARAMS, tasks)
    assert_same_training(serial, serial_losses, batched, batched_losses)
    torch.testing.assert_close(batched[1].projection.weight, models[1].projection.weight)


def test_global_rng_left_as_by_the_serial_loop() -> None:
    models, datas = make_models("mlp"), make_data()
    xs, ys = [d.train_x for d in datas], [d.train_y for d in datas]
    local_sgd_batched(models, xs, ys, PARAMS, SEEDS, [None] * CLIENTS)
    after_batched = torch.rand(3)
    torch.manual_seed(SEEDS[-1])
    torch.testing.assert_close(after_batched, torch.rand(3))


def test_empty_data_gives_nan_losses() -> None:
    models = make_models("mlp")
    before = copy.deepcopy(models[0].state_dict())
    xs, ys = [torch.zeros(0, *SHAPE)] * CLIENTS, [torch.zeros(0, dtype=torch.long)] * CLIENTS
    losses = local_sgd_batched(models, xs, ys, PARAMS, SEEDS, [None] * CLIENTS)
    assert all(math.isnan(loss) for loss in losses)
    for key, value in before.items():
        torch.testing.assert_close(models[0].state_dict()[key], value)


def test_cannot_batch_different_sample_counts() -> None:
    datas = make_data()
    datas[2] = make_data(samples=SAMPLES + 1, count=1)[0]
    assert not can_batch(make_models("mlp"), datas, PARAMS, [None] * CLIENTS)


@pytest.mark.parametrize("name", ["cnn_mnist", "cnn_cifar", "resnet8"])
def test_cannot_batch_dropout_or_batchnorm(name: str) -> None:
    assert not can_batch(make_models(name), make_data(), PARAMS, [None] * CLIENTS)


def test_cannot_batch_mixed_architectures_tasks_or_optimisers() -> None:
    datas, plain = make_data(), [None] * CLIENTS
    mixed = make_models("mlp", count=2) + make_models("small_cnn", count=1)
    assert not can_batch(mixed, datas, PARAMS, plain)
    wider = make_models("mlp", count=2) + [build_model("mlp", SHAPE, CLASSES, hidden=16)]
    assert not can_batch(wider, datas, PARAMS, plain)
    adam = TaskSpec(outputs=CLASSES, optimizer=OptimizerSpec("adam", lr=1e-3))
    assert not can_batch(make_models("mlp"), datas, PARAMS, [None, None, adam])
    sgd = TaskSpec(outputs=CLASSES, optimizer=OptimizerSpec("sgd", lr=0.01))
    assert not can_batch(make_models("mlp"), datas, PARAMS, [None, None, sgd])
    bce = TaskSpec("attributes", "attributes", "bce", CLASSES, metrics=("f1",))
    assert not can_batch(make_models("mlp"), datas, PARAMS, [None, None, bce])
    assert not can_batch(make_models("mlp"), datas[:2], PARAMS, plain)
    assert not can_batch([], [], PARAMS, [])


def test_batched_module_does_not_import_ray() -> None:
    code = "import sys, raymtl.algorithms.batched; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
