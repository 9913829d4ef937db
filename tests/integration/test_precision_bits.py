"""runtime.precision: bf16-mixed changes how clients compute, never what travels: every
message goes in float32 and counts fp32's bits (README, runtime.precision). Sheaf-FMTL's
P_ij θ_i (its map maths runs outside autocast) and FedMuscle's representations (model
outputs made under autocast, sent as float32) used to travel in bfloat16, at half the bits."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from raymtl.config import parse_config
from raymtl.models import build_model
from raymtl.runtime import run_experiment
from raymtl.runtime.hosts.compute import float32_on_the_wire
from tests.conftest import digits_experiment

ALGORITHMS = {
    "sheaf_fmtl": {"topology.kind": "ring", "algorithm.params": {"epochs": 1}},
    "fedmuscle": {
        "data.public": {"size": 60},
        "algorithm.params": {
            "epochs": 1,
            "contrastive_steps": 2,
            "public_batch": 8,
            "dim": 16,
            "partners": 2,
        },
    },
}


def bits_by_kind(tmp_path, algorithm: str, precision: str) -> pd.Series:
    raw = digits_experiment(
        tmp_path / precision,
        **{"algorithm.name": algorithm, "model.name": "mlp", "rounds": 1},
        **ALGORITHMS[algorithm],
        **{"runtime.precision": precision},
    )
    run_dir = run_experiment(parse_config(raw), tmp_path / precision / "run")
    messages = pd.read_parquet(run_dir / "messages.parquet")
    return messages.groupby("kind")["bits"].agg(["sum", "count"])


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_bf16_mixed_messages_travel_in_float32(tmp_path, algorithm):
    fp32 = bits_by_kind(tmp_path, algorithm, "fp32")
    bf16 = bits_by_kind(tmp_path, algorithm, "bf16-mixed")
    pd.testing.assert_frame_equal(bf16, fp32)
    if algorithm == "sheaf_fmtl":
        # 2 × 32 × d_ij bits per edge and round each way: the mlp's d_i = 2410 on 8x8
        # digits, d_ij = ⌊0.01·2410⌋ = 24; 6 clients on a ring send to 2 neighbours twice.
        d_i = sum(p.numel() for p in build_model("mlp", (1, 8, 8), 10).parameters())
        d_ij = math.floor(0.01 * d_i)
        assert (d_i, d_ij) == (2410, 24)
        projections = bf16.loc["projection"]
        assert projections["count"] == 6 * 2 * 2
        assert projections["sum"] == projections["count"] * 32 * d_ij


def test_float32_on_the_wire_casts_bfloat16_in_the_message_itself():
    half = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    exact = torch.tensor([3.0])
    counts = torch.tensor([4])
    tensors = {"value": half, "other": exact, "counts": counts}
    assert float32_on_the_wire(tensors) is tensors  # one dict: shared sends stay shared
    assert tensors["value"].dtype == torch.float32
    assert tensors["value"].tolist() == [1.5, -2.25]
    assert tensors["other"] is exact and tensors["counts"] is counts  # untouched
