"""Batched local SGD (torch.func, vmap over clients) against the serial `local_sgd`."""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raymtl.algorithms import batched as batched_module
from raymtl.algorithms.base import FederationInfo, LocalTrainingParams, State, StepContext
from raymtl.algorithms.batched import (
    TOLERANCE,
    batch_refusal,
    batched_equals_serial,
    can_batch,
    local_sgd_batched,
    train_local_models,
)
from raymtl.algorithms.training import local_sgd
from raymtl.data.client_data import ClientData
from raymtl.models import build_model
from raymtl.models.registry import FedModel
from raymtl.runtime.hosts.step_warnings import AlgorithmWarnings
from raymtl.tasks.spec import OptimizerSpec, TaskSpec

SHAPE = (1, 8, 8)
CLASSES = 5
CLIENTS = 3
SAMPLES = 20  # batch_size 8: batches of 8, 8, 4
PARAMS = LocalTrainingParams(
    epochs=2, lr=0.05, batch_size=8, momentum=0.9, weight_decay=1e-4, clip_grad=1.0
)
SEEDS = [11, 22, 33]


def make_models(name: str, count: int = CLIENTS, outputs: int = CLASSES, shape=SHAPE) -> list:
    models = []
    for index in range(count):
        torch.manual_seed(100 + index)  # a different initialisation per client
        models.append(build_model(name, shape, outputs))
    return models


def make_data(
    samples: int = SAMPLES, count: int = CLIENTS, targets: str = "label", shape=SHAPE
) -> list:
    generator = torch.Generator().manual_seed(0)
    datas = []
    for _ in range(count):
        x = torch.randn(samples, *shape, generator=generator)
        if targets == "label":
            y = torch.randint(0, CLASSES, (samples,), generator=generator)
        else:
            y = torch.randn(samples, CLASSES, generator=generator)
        datas.append(SimpleNamespace(train_x=x, train_y=y))
    return datas


def train_both(models, datas, params, tasks):
    """(serial models, serial losses, batched models, batched losses) from the same start;
    both paths ran the same number of steps."""
    serial = [copy.deepcopy(model) for model in models]
    serial_runs = [
        local_sgd(model, data.train_x, data.train_y, params, seed, task=task)
        for model, data, seed, task in zip(serial, datas, SEEDS, tasks, strict=True)
    ]
    batched = [copy.deepcopy(model) for model in models]
    xs, ys = [d.train_x for d in datas], [d.train_y for d in datas]
    batched_runs = local_sgd_batched(batched, xs, ys, params, SEEDS, tasks)
    assert [run.steps for run in batched_runs] == [run.steps for run in serial_runs]
    serial_losses = [run.loss for run in serial_runs]
    return serial, serial_losses, batched, [run.loss for run in batched_runs]


def assert_same_training(serial, serial_losses, batched, batched_losses) -> None:
    """Losses, parameters and buffers (BatchNorm's statistics, its step count exactly)."""
    assert batched_losses == pytest.approx(serial_losses, abs=TOLERANCE)
    for one, other in zip(serial, batched, strict=True):
        for (name, expected), (_, actual) in zip(
            one.state_dict().items(), other.state_dict().items(), strict=True
        ):
            torch.testing.assert_close(actual, expected, atol=TOLERANCE, rtol=0, msg=name)


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


@pytest.mark.parametrize("name", ["mlp", "cnn_mnist"])
def test_global_rng_left_as_by_the_serial_loop(name: str) -> None:
    """Seeded with the last client's seed, and advanced by its dropout draws (cnn_mnist:
    6 steps, one mask each), exactly as the serial loop leaves it."""
    models, datas = make_models(name), make_data()
    xs, ys = [d.train_x for d in datas], [d.train_y for d in datas]
    for model, x, y, seed in zip(copy.deepcopy(models), xs, ys, SEEDS, strict=True):
        local_sgd(model, x, y, PARAMS, seed)
    after_serial = torch.get_rng_state()
    torch.manual_seed(0)  # anything else: the batched call must set it
    local_sgd_batched(models, xs, ys, PARAMS, SEEDS, [None] * CLIENTS)
    assert torch.equal(torch.get_rng_state(), after_serial)
    torch.manual_seed(SEEDS[-1])
    assert torch.equal(torch.get_rng_state(), after_serial) == (name == "mlp")


def test_empty_data_gives_nan_losses() -> None:
    models = make_models("mlp")
    before = copy.deepcopy(models[0].state_dict())
    xs, ys = [torch.zeros(0, *SHAPE)] * CLIENTS, [torch.zeros(0, dtype=torch.long)] * CLIENTS
    runs = local_sgd_batched(models, xs, ys, PARAMS, SEEDS, [None] * CLIENTS)
    assert all(math.isnan(run.loss) and run.steps == 0 for run in runs)
    for key, value in before.items():
        torch.testing.assert_close(models[0].state_dict()[key], value)


def test_cannot_batch_different_sample_counts() -> None:
    datas = make_data()
    datas[2] = make_data(samples=SAMPLES + 1, count=1)[0]
    assert not can_batch(make_models("mlp"), datas, PARAMS, [None] * CLIENTS)


# Dropout (cnn_mnist, cnn_cifar) and batch normalisation (resnet8).
DROPOUT_AND_BN = [("cnn_mnist", SHAPE), ("cnn_cifar", (3, 8, 8)), ("resnet8", SHAPE)]


@pytest.mark.parametrize(("name", "shape"), DROPOUT_AND_BN)
def test_dropout_and_batch_norm_batch_as_serial(name: str, shape) -> None:
    models = make_models(name, shape=shape)
    datas, tasks = make_data(shape=shape), [None] * CLIENTS
    assert batch_refusal(models, datas, PARAMS, tasks) is None
    serial, serial_losses, batched, batched_losses = train_both(models, datas, PARAMS, tasks)
    assert_same_training(serial, serial_losses, batched, batched_losses)
    assert len({round(loss, 6) for loss in batched_losses}) == CLIENTS
    steps = PARAMS.epochs * math.ceil(SAMPLES / PARAMS.batch_size)
    for start, end in zip(models, batched, strict=True):
        before, after = start.state_dict(), end.state_dict()
        for key, value in after.items():
            if key.endswith("num_batches_tracked"):
                assert value.item() == before[key].item() + steps
            elif key.endswith("running_mean"):  # the statistics moved (written back)
                assert not torch.equal(value, before[key])


def test_resnet18_batches() -> None:
    models, datas = make_models("resnet18", shape=(3, 16, 16)), make_data(shape=(3, 16, 16))
    assert batch_refusal(models, datas, PARAMS, [None] * CLIENTS) is None


def masks_of(model: nn.Module, dropout: nn.Module) -> list[torch.Tensor]:
    """The masks `dropout` applies in training, step by step (output / input where the
    input is not 0: exact, as p = 0.5 scales by 2)."""
    masks = []

    def keep(module, inputs, output):
        (x,) = inputs
        masks.append(torch.where(x != 0, output / x, torch.nan))

    dropout.register_forward_hook(keep)
    return masks


def test_dropout_masks_are_the_serial_masks_bit_for_bit(monkeypatch) -> None:
    models, datas = make_models("cnn_mnist"), make_data()
    serial = [copy.deepcopy(model) for model in models]
    serial_masks = [masks_of(model, model.head.dropout) for model in serial]
    for model, data, seed in zip(serial, datas, SEEDS, strict=True):
        local_sgd(model, data.train_x, data.train_y, PARAMS, seed)
    drawn = []
    draw = batched_module._draw_masks
    monkeypatch.setattr(
        batched_module, "_draw_masks", lambda *args: drawn.append(draw(*args)) or drawn[-1]
    )
    xs, ys = [d.train_x for d in datas], [d.train_y for d in datas]
    local_sgd_batched(models, xs, ys, PARAMS, SEEDS, [None] * CLIENTS)
    assert len(drawn) == len(serial_masks[0]) == 6  # 2 epochs of batches of 8, 8, 4
    for step, (stacked,) in enumerate(drawn):
        for client in range(CLIENTS):
            expected = serial_masks[client][step]
            seen = ~expected.isnan()
            assert seen.any() and set(expected[seen].unique().tolist()) == {0.0, 2.0}
            assert torch.equal(stacked[client][seen], expected[seen])


class TwoDropouts(FedModel):
    """Dropout(0.3) twice (one module called twice), then an in-place Dropout(0.2): the
    draws go in call order, p's scale 1/(1-p) is not a power of two."""

    name = "two_dropouts_test"

    def __init__(self, input_shape, num_classes):
        size = math.prod(input_shape)
        backbone = nn.Sequential(
            OrderedDict(
                flatten=nn.Flatten(),
                fc=nn.Linear(size, 16),
                drop=nn.Dropout(0.3),
                relu=nn.ReLU(),
                again=nn.Linear(16, 16),
            )
        )
        super().__init__(backbone, nn.Linear(16, num_classes), 16)
        self.last = nn.Dropout(0.2, inplace=True)

    def forward(self, x):
        hidden = self.backbone(x)
        return self.head(self.last(self.backbone.drop(hidden)))


def test_dropout_layers_reused_inplace_and_any_p_batch_as_serial() -> None:
    models = []
    for index in range(CLIENTS):
        torch.manual_seed(index)
        models.append(TwoDropouts(SHAPE, CLASSES))
    datas, tasks = make_data(), [None] * CLIENTS
    assert can_batch(models, datas, PARAMS, tasks)
    assert_same_training(*train_both(models, datas, PARAMS, tasks))


def conv_bn(track_running_stats: bool) -> nn.Module:
    torch.manual_seed(len(SEEDS))
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4, track_running_stats=track_running_stats),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, CLASSES),
    )


@pytest.mark.parametrize("track_running_stats", [True, False])
def test_batch_norm_with_or_without_running_statistics(track_running_stats: bool) -> None:
    models = [conv_bn(track_running_stats) for _ in range(CLIENTS)]
    for index, model in enumerate(models):
        model[1].weight.data.fill_(1 + index / 10)  # clients differ
    datas, tasks = make_data(), [None] * CLIENTS
    assert can_batch(models, datas, PARAMS, tasks)
    serial, serial_losses, batched, batched_losses = train_both(models, datas, PARAMS, tasks)
    assert_same_training(serial, serial_losses, batched, batched_losses)
    assert len(batched[0].state_dict()) == (9 if track_running_stats else 6)  # 3 buffers


class RandomForward(nn.Module):
    """Draws noise in its forward, outside any nn.Dropout."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.fc(F.dropout(x.flatten(1), 0.5, training=True))


def refusal_of(models, datas=None, params=PARAMS, tasks=None) -> str | None:
    refusal = batch_refusal(models, datas or make_data(), params, tasks or [None] * CLIENTS)
    return None if refusal is None else str(refusal)


def test_refusals_say_why_in_one_line() -> None:
    datas = make_data()
    datas[2] = make_data(samples=SAMPLES + 1, count=1)[0]
    assert refusal_of(make_models("mlp"), datas) == "their sample counts differ (20, 20, 21)"
    channels = [nn.Sequential(nn.Conv2d(1, 2, 3), nn.Dropout2d(0.5)) for _ in range(CLIENTS)]
    assert refusal_of(channels) == "only nn.Dropout masks are reproduced, not its Dropout2d's (1)"
    cumulative = [conv_bn(True) for _ in range(CLIENTS)]
    for model in cumulative:
        model[1].momentum = None
    assert refusal_of(cumulative) == (
        "its BatchNorm2d's momentum is None: a cumulative average (1)"
    )
    instance = [
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2, track_running_stats=True))
        for _ in range(CLIENTS)
    ]
    assert refusal_of(instance) == (
        "only BatchNorm's running statistics batch, not its InstanceNorm2d's (1)"
    )
    assert refusal_of([RandomForward() for _ in range(CLIENTS)]) == (
        "its forward draws random numbers outside nn.Dropout (aten.bernoulli_.float)"
    )
    adam = TaskSpec(outputs=CLASSES, optimizer=OptimizerSpec("adam", lr=1e-3))
    assert refusal_of(make_models("mlp"), tasks=[None, adam, None]) == (
        "a task's optimiser is not SGD (adam)"
    )
    frozen = make_models("mlp")
    frozen[0].head.bias.requires_grad_(False)
    assert refusal_of(frozen) == "some parameters are frozen (requires_grad=False)"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert refusal_of(make_models("mlp")) == batched_module.AUTOCAST_REFUSAL
    half = [nn.Dropout(0.5) if index else nn.Dropout(0.25) for index in range(CLIENTS)]
    assert refusal_of([nn.Sequential(nn.Linear(64, 2), d) for d in half]) == (
        "their parameter shapes, buffers or layer settings differ"
    )


def test_refusal_warned_once_per_federation_and_reason() -> None:
    """train_local_models trains refused clients one by one and logs why, through the
    raymtl.algorithms loggers a host's AlgorithmWarnings collects, once per federation."""
    params = LocalTrainingParams(epochs=1, lr=0.05, batch_size=8)
    counts = (SAMPLES, SAMPLES, SAMPLES + 1)

    def one_round(federation, round_index: int) -> list[str]:
        states = []
        for model, samples in zip(make_models("cnn_mnist"), counts, strict=True):
            (data,) = make_data(samples=samples, count=1)
            client = ClientData(data.train_x, data.train_y, data.train_x, data.train_y, 5, SHAPE)
            states.append(State(model=model, data=client))
        contexts = [
            StepContext(f"client/{i}", round_index, 2, 0, (0, 1, 2), federation) for i in range(3)
        ]
        with AlgorithmWarnings() as warned:
            train_local_models(states, contexts, params)
        assert all(math.isfinite(state.extras["train_loss"]) for state in states)
        return warned.messages

    federation = FederationInfo(3, counts, (5, 5, 5), SHAPE)
    line = (
        "runtime.batch_clients > 1 but clients of model cnn_mnist train one at a time: "
        "their sample counts differ (20, 20, 21)"
    )
    assert one_round(federation, 1) == [line]
    assert one_round(federation, 2) == []
    assert one_round(FederationInfo(3, counts, (5, 5, 5), SHAPE), 1) == [line]


@pytest.mark.parametrize("name", ["cnn_mnist", "resnet8"])
def test_batched_equals_serial_for_the_gpu_check(name: str) -> None:
    assert batched_equals_serial(name, "cpu", clients=2, samples=12) <= TOLERANCE


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
