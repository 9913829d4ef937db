"""A whole run records its FLOPs by kind of phase and their running total."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_flops import cnn_mnist_forward_flops


def test_a_run_records_its_flops_by_kind_and_their_running_total(tmp_path: Path):
    import raymtl

    results = raymtl.run(
        "jobs/fedavg_digits.yaml",
        overrides=[
            "rounds=2",
            "seeds=[0]",
            "runtime.executor=inline",
            f"output.dir={tmp_path}",
            "output.plots=false",
            "metrics.target=0.01",
        ],
    )
    rounds, clients = results.rounds, results.clients
    kinds = ["flops_train", "flops_aggregate", "flops_receive", "flops_evaluate"]
    assert rounds["flops"].tolist() == pytest.approx(rounds[kinds].sum(axis=1).tolist())
    assert rounds["cum_flops"].tolist() == pytest.approx(rounds["flops"].cumsum().tolist())
    forward, conv1 = cnn_mnist_forward_flops(8)
    tested = clients[clients["round"] == 1]["test_samples"].sum()
    trained = clients[clients["round"] == 1]["samples"].sum()
    assert rounds["flops_evaluate"].iloc[0] == tested * forward
    assert rounds["flops_train"].iloc[0] == trained * (3 * forward - conv1)  # 1 epoch, all
    assert rounds["flops_aggregate"].iloc[0] == 0  # an average: elementwise, no products
    summary = results.summary
    assert summary["final"]["total_flops"]["mean"] == rounds["cum_flops"].iloc[-1]
    assert summary["target"]["flops"]["mean"] == rounds["cum_flops"].iloc[0]
