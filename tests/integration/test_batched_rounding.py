"""`make gpu-check`'s `batched / resnet8, batch_clients 4 = 1` on the CPU (issue 41).

The case of benchmarks/gpu_check.py's `batch_clients_equal`: digits, 8 clients of 60 iid
samples (50 train), resnet8, FedAvg, 1 epoch at lr 0.05, 2 rounds, inline; runtime.batch_clients
4 against 1. In float32 the two runs agree within `rounding_tolerance` (float32's epsilon
over the run's 4 SGD steps and the sums each makes); in float64 (the same initial weights and
data, cast) the batched path agrees with the serial one to float64 rounding, and each float32
run lies within half the tolerance of its float64 twin: the float32 gap is rounding (batch
norm amplifies it), not a difference in what the batched path computes.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pandas as pd
import pytest
import torch

from raymtl.algorithms import batched
from raymtl.algorithms.base import LocalTrainingParams
from raymtl.config import parse_config
from raymtl.runtime import run_experiment
from tests.conftest import digits_experiment

CASE = {
    "model.name": "resnet8",
    "data.num_clients": 8,
    "data.partition": {"kind": "iid", "max_samples_per_client": 60},
    "algorithm.params": {"epochs": 1, "lr": 0.05},
}
SHAPE, CLASSES = (1, 8, 8), 10  # digits
COMPARED = ["seed", "round", "client", "loss", "accuracy", "samples", "bits_up", "bits_down"]


def run_case(tmp_path, batch_clients: int) -> pd.DataFrame:
    raw = digits_experiment(tmp_path, **CASE, **{"runtime.batch_clients": batch_clients})
    run_dir = run_experiment(parse_config(raw), tmp_path / f"batch-{batch_clients}")
    clients = pd.read_parquet(run_dir / "clients.parquet")[COMPARED]
    return clients.sort_values(["seed", "round", "client"]).reset_index(drop=True)


@contextlib.contextmanager
def float64_training(monkeypatch):
    """Every model built as in float32 (the same initial weights), then cast to float64;
    every client's images decoded in float64; torch's default dtype float64."""
    from raymtl import models
    from raymtl.data import client_data

    build, decode = models.build_model, client_data.decode_images

    def build_in_float64(*args, **kwargs):
        torch.set_default_dtype(torch.float32)
        try:
            return build(*args, **kwargs).double()
        finally:
            torch.set_default_dtype(torch.float64)

    monkeypatch.setattr(models, "build_model", build_in_float64)
    monkeypatch.setattr(client_data, "decode_images", lambda *a, **k: decode(*a, **k).double())
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)
        monkeypatch.undo()


def tolerance(clients: pd.DataFrame, dtype: torch.dtype) -> float:
    """batched.rounding_tolerance of the case, as gpu_check derives it: S = rounds × epochs ×
    batches an epoch, the largest loss as the scale."""
    batch = LocalTrainingParams().batch_size
    samples = int(clients["samples"].max())
    steps = clients["round"].max() * math.ceil(samples / batch)
    assert steps == 4  # 2 rounds of 2 steps (32 + 18 samples)
    from raymtl.models import build_model

    model = build_model("resnet8", SHAPE, CLASSES)
    x = torch.zeros(min(batch, samples), *SHAPE)
    return batched.rounding_tolerance(model, x, steps, float(clients["loss"].abs().max()), dtype)


def largest_gap(a: pd.DataFrame, b: pd.DataFrame) -> float:
    pd.testing.assert_frame_equal(a.drop(columns=["loss"]), b.drop(columns=["loss"]))
    return float(np.abs(a["loss"].to_numpy() - b["loss"].to_numpy()).max())


def test_batched_resnet8_is_float32_rounding_away_and_equal_in_float64(tmp_path, monkeypatch):
    calls = []
    trained_together = batched.local_sgd_batched

    def counted(models, *args, **kwargs):
        calls.append(len(models))
        return trained_together(models, *args, **kwargs)

    monkeypatch.setattr(batched, "local_sgd_batched", counted)
    single = {k: run_case(tmp_path / "f32", k) for k in (1, 4)}
    assert calls == [4] * 4  # 2 rounds of 8 clients, 4 at a time: the batched path ran
    atol32 = tolerance(single[1], torch.float32)
    assert 1e-3 < atol32 < 1e-2  # 3.2e-3: 2·2^-23·2.31·4·Σ√n, Σ√n = 1443 (resnet8)
    gap32 = largest_gap(single[1], single[4])
    assert gap32 <= atol32

    with float64_training(monkeypatch):
        monkeypatch.setattr(batched, "local_sgd_batched", counted)
        double = {k: run_case(tmp_path / "f64", k) for k in (1, 4)}
    assert calls == [4] * 8
    # It ran in float64: every message is twice the bits.
    assert (double[1]["bits_up"] == 2 * single[1]["bits_up"]).all()
    atol64 = tolerance(double[1], torch.float64)
    assert atol64 < 1e-10
    assert largest_gap(double[1], double[4]) <= atol64
    # The derivation's premise: each float32 run is within half the tolerance of the exact
    # (float64) training; on this machine's CPU ~5.6e-5 (round 2), ~1.9e-6 in round 1.
    for clients in single.values():
        exact = double[1]["loss"].to_numpy()
        assert np.abs(clients["loss"].to_numpy() - exact).max() <= atol32 / 2


@pytest.mark.parametrize("name", ["resnet8", "cnn_mnist"])
def test_rounding_tolerance_counts_every_sum_of_a_step(name):
    from raymtl.models import build_model

    model = build_model(name, SHAPE, CLASSES)
    sums = batched.step_sums(model, torch.zeros(32, *SHAPE))
    convolutions = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    norms = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert len(sums) == 3 * (convolutions + linear) + 4 * norms
    depth = sum(math.sqrt(n) for n in sums)
    eps = torch.finfo(torch.float32).eps
    expected = 2 * eps * 2.5 * 4 * depth
    got = batched.rounding_tolerance(model, torch.zeros(32, *SHAPE), 4, 2.5)
    assert got == pytest.approx(expected)
    assert eps == 2**-23
    # The stem of resnet8: 1x3x3 inputs a sum, 16x3x3 for the input's gradient, 32·8·8 rows
    # for the weight's gradient; then its batch norm over 32·8·8 values, four times.
    if name == "resnet8":
        assert sums[:7] == [9, 144, 2048, 2048, 2048, 2048, 2048]
