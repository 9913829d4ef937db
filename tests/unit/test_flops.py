"""FLOP counting (raymtl/flops.py): the counts against the analytic count of cnn_mnist's
convolutions and linear layers, counted once per key, and the run's columns."""

from __future__ import annotations

import torch

from raymtl.algorithms.base import LocalTrainingParams
from raymtl.algorithms.batched import local_sgd_batched
from raymtl.algorithms.training import evaluate, local_sgd
from raymtl.flops import FlopMeter, add_passes
from raymtl.models.registry import build_model


def cnn_mnist_forward_flops(side: int) -> tuple[int, int]:
    """(forward FLOPs of one sample, of which the first convolution's) for cnn_mnist on a
    side × side image: conv 1→32 5×5 'same', pool, conv 32→64 5×5 'same', pool, fc → 512,
    head 512 → 10. A product of (m×k)·(k×n) is 2·m·n·k; a convolution is 2 · output pixels ·
    out channels · in channels · kernel area; biases and activations are not counted."""
    conv1 = 2 * side * side * 32 * 1 * 25
    conv2 = 2 * (side // 2) ** 2 * 64 * 32 * 25
    fc = 2 * (side // 4) ** 2 * 64 * 512
    head = 2 * 512 * 10
    return conv1 + conv2 + fc + head, conv1


def test_one_local_epoch_of_cnn_mnist_counts_its_convolutions_and_linear_layers():
    torch.manual_seed(0)
    model = build_model("cnn_mnist", (1, 28, 28), 10)
    n, batch_size = 70, 32  # batches of 32, 32 and 6
    x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
    params = LocalTrainingParams(epochs=1, lr=0.01, batch_size=batch_size)
    forward, conv1 = cnn_mnist_forward_flops(28)
    # Backward: twice the forward (input and weight gradients), except that the image needs
    # no gradient, so the first convolution computes its weight gradient only.
    per_sample = forward + (2 * forward - conv1)
    assert per_sample == 3 * 24_546_304 - 1_254_400  # the figures written out by hand

    meter = FlopMeter()
    with meter.passes() as counted:
        local_sgd(model, x, y, params, seed=0)
    assert counted.flops == n * per_sample

    with meter.passes() as counted:
        evaluate(model, x, y)
    assert counted.flops == n * forward


def test_a_pass_is_measured_once_per_key_then_multiplied(monkeypatch):
    import raymtl.flops as flops

    measured = []
    real_measure = flops.measure_pass

    def counting_measure(*args):
        measured.append(args[0])
        return real_measure(*args)

    monkeypatch.setattr(flops, "measure_pass", counting_measure)
    model = build_model("cnn_mnist", (1, 28, 28), 10)
    meter = FlopMeter()
    with meter.passes() as counted, torch.no_grad():
        for _ in range(5):
            model(torch.zeros(4, 1, 28, 28))
        model(torch.zeros(2, 1, 28, 28))  # another batch shape: a second measurement
    forward, _ = cnn_mnist_forward_flops(28)
    assert counted.flops == 5 * 4 * forward + 2 * forward
    assert len(measured) == 2
    # A part of a model called on its own is a pass of its own (a head on features).
    with meter.passes() as counted, torch.no_grad():
        model.head(torch.zeros(3, 512))
    assert counted.flops == 3 * 2 * 512 * 10


def test_passes_outside_a_metered_block_are_not_counted():
    model = build_model("cnn_mnist", (1, 28, 28), 10)
    meter = FlopMeter()
    with meter.passes() as counted:
        pass
    with torch.no_grad():
        model(torch.zeros(2, 1, 28, 28))  # after the block: the hooks are gone
    assert counted.flops == 0
    add_passes(model, torch.zeros(2, 1, 28, 28), training=False, times=3)  # no-op outside


def test_a_coordinators_step_is_counted_every_time_it_runs():
    """A step whose cost changes from round to round with the same inbox (the communities a
    graph step finds) is counted as it ran each time, never from an earlier run's figure."""
    meter = FlopMeter()
    sizes = iter([8, 32])

    def step():
        rows = next(sizes)
        a, b = torch.ones(rows, 16), torch.ones(16, 4)
        return a @ b  # 2·rows·4·16 FLOPs

    first, first_flops = meter.step(step)
    second, second_flops = meter.step(step)
    assert (first_flops, second_flops) == (2 * 8 * 4 * 16, 2 * 32 * 4 * 16)
    assert first.shape == (8, 4) and second.shape == (32, 4)


def test_batched_training_counts_what_the_serial_path_counts():
    torch.manual_seed(0)
    models = [build_model("cnn_mnist", (1, 8, 8), 10) for _ in range(3)]
    for model in models:  # plain SGD without dropout can batch
        model.head.dropout.p = 0.0
    xs = [torch.randn(20, 1, 8, 8) for _ in models]
    ys = [torch.randint(0, 10, (20,)) for _ in models]
    params = LocalTrainingParams(epochs=2, lr=0.01, batch_size=8)
    meter = FlopMeter()
    with meter.passes() as serial:
        for k, model in enumerate(models):
            local_sgd(model, xs[k], ys[k], params, seed=k)
    with meter.passes() as batched:
        local_sgd_batched(models, xs, ys, params, [0, 1, 2], [None] * 3)
    forward, conv1 = cnn_mnist_forward_flops(8)
    assert serial.flops == batched.flops == 3 * 2 * 20 * (3 * forward - conv1)
