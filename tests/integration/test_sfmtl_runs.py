"""SFMTL-Graph, FedU, dFedU and pFedMe end to end: `raymtl run` on Ray, accounting, compare."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from raymtl.cli import app
from raymtl.models import build_model
from raymtl.runtime import run_experiment
from tests.conftest import write_experiment

OUTPUTS = ["config.yaml", "clients.parquet", "rounds.parquet", "messages.parquet", "summary.json"]
# FedU, dFedU and pFedMe run (finite metrics, exact bits) in test_all_algorithms.py; here
# SFMTL-Graph goes through the CLI on Ray, with its graph table and plots.
ALGORITHMS = {"sfmtl_graph": {}}


@pytest.mark.ray
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_two_rounds_through_raymtl_run(ray_session, tmp_path, algorithm):
    settings = {"algorithm.name": algorithm, "algorithm.params": {"epochs": 1}}
    path = write_experiment(tmp_path, **settings, **ALGORITHMS[algorithm])
    result = CliRunner().invoke(
        app, ["run", str(path), "runtime.executor=ray", "output.plots=true"]
    )
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("test-")]
    for name in OUTPUTS:
        assert (run_dir / name).is_file(), name
    assert list(pd.read_parquet(run_dir / "rounds.parquet")["round"]) == [1, 2]
    assert sorted(pd.read_parquet(run_dir / "clients.parquet")["client"].unique()) == list(range(6))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"mean_accuracy", "worst10_accuracy", "worst20_accuracy", "std_accuracy"} <= set(
        summary["final"]
    )
    if algorithm == "sfmtl_graph":
        graph = pd.read_parquet(run_dir / "graph.parquet")
        columns = {"seed", "round", "i", "j", "s_ij", "fs_ij", "as_ij", "community_i"}
        assert columns <= set(graph.columns) and set(graph["round"]) == {1, 2}
        assert -1 <= summary["graph"]["ari_last"]["mean"] <= 1
        for plot in ("communities_over_rounds.png", "similarity_last.png"):
            assert (run_dir / "plots" / plot).stat().st_size > 0


def test_sfmtl_uplink_is_head_and_anchor_rows_only(make_config):
    """Inline run: message kinds and sizes; the backbone never leaves a client."""
    cfg = make_config(**{"algorithm.name": "sfmtl_graph", "algorithm.params": {"epochs": 1}})
    run_dir = run_experiment(cfg)
    messages = pd.read_parquet(run_dir / "messages.parquet")
    model = build_model("cnn_mnist", (1, 8, 8), 10)
    head = sum(p.numel() for name, p in model.named_parameters() if name.startswith("head."))
    anchor_rows = 2 * model.feature_dim  # 2 classes per client
    up = messages.query("src_role == 'client'")
    assert set(up["kind"]) == {"head_anchor"} and set(up["dst"]) == {"server"}
    assert set(up["bits"]) == {(head + anchor_rows) * 32 + 2 * 32}  # + 2 int32 class ids
    assert list(up.groupby("round").size()) == [3, 3]  # ⌈0.5 · 6⌉ sampled clients
    down = messages.query("dst_role == 'client'")
    assert set(down["kind"]) == {"head_anchor"} and set(down["bits"]) == {(head + anchor_rows) * 32}
    assert set(up["src"]) >= set(down["dst"])
    graph = messages.query("src_role == 'graph' or dst_role == 'graph'")
    assert set(graph["kind"]) - {"communities"} == {k for k in graph["kind"] if "upload/" in k}
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert list(rounds["bits_up"]) == [3 * ((head + anchor_rows) * 32 + 64)] * 2
    # even on 8×8 digits (a small model) the upload is < 5% of what FedAvg would send
    assert max(up["bits"]) < 0.05 * sum(p.numel() for p in model.parameters()) * 32


def test_compare_two_algorithms_writes_table_and_figures(tmp_path):
    path = write_experiment(tmp_path, **{"algorithm.params": {"epochs": 1}})
    out = tmp_path / "cmp"
    arms = ["compare", str(path), "algorithm.name=sfmtl_graph,fedu", "output.plots=true"]
    result = CliRunner().invoke(app, [*arms, "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "table.csv")
    assert len(table) == 2 and "mean_accuracy_mean" in table.columns
    for figure in ("comparison_mean_accuracy.png", "comparison_worst10_accuracy.png"):
        assert (out / "plots" / figure).stat().st_size > 0
