"""Sheaf-FMTL end to end on one shared local Ray: three model sizes, only d_ij-vectors on the
wire, its outputs, parity with the in-process executor, and checkpoints that hold the maps."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from raymtl.algorithms.sheaf_fmtl import interaction_dim
from raymtl.config import ConfigError, parse_config
from raymtl.models import build_model
from raymtl.runtime import resume_experiment, run_experiment
from tests.conftest import digits_experiment

SIZES = {"small_cnn": 0.34, "medium_cnn": 0.33, "large_cnn": 0.33}


def hetero(tmp_path, **overrides):
    """Six digits clients with three CNN sizes on a connected random graph, γ = 0.05."""
    settings = {
        "algorithm.name": "sheaf_fmtl",
        "algorithm.params": {"lr": 0.05, "gamma": 0.05, "lam": 0.01},
        "topology.kind": "erdos_renyi",
        "topology.params": {"p": 0.5},
        "model.name": "small_cnn",
        "model.mix": SIZES,
        "rounds": 3,
        "checkpoint_every": 2,
        "runtime.executor": "ray",
        **overrides,
    }
    return parse_config(digits_experiment(tmp_path, **settings))


def test_three_model_sizes_exchange_only_projections(ray_session, tmp_path):
    cfg = hetero(tmp_path, **{"output.plots": True})
    run_dir = run_experiment(cfg, tmp_path / "run")
    clients = pd.read_parquet(run_dir / "clients.parquet")
    dims = clients.drop_duplicates("client").set_index("client")["model_params"]
    assert set(clients["model"]) == set(SIZES)
    messages = pd.read_parquet(run_dir / "messages.parquet")
    assert set(messages["kind"]) == {"dim", "projection"}  # never a model, never a map
    for (i, j), rows in messages[messages["kind"] == "projection"].groupby(["src", "dst"]):
        d_ij = interaction_dim(dims[int(i[7:])], dims[int(j[7:])], 0.05)
        per_round = rows.groupby("round")["bits"].sum()
        assert (per_round == 2 * 32 * d_ij).all(), (i, j)  # two sends a round, d_ij floats
    maps = pd.read_parquet(run_dir / "maps.parquet")
    assert len(maps) == len(messages[messages["kind"] == "dim"]) * 3  # every map, every round
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["maps"]["directed_edges"] > 0
    for plot in ("maps_last.png", "maps_over_rounds.png", "graph.png"):
        assert (run_dir / "plots" / plot).is_file(), plot
    hosts = pd.read_parquet(run_dir / "hosts.parquet")
    assert (hosts["peak_rss"] > 0).all()
    # the parameter counts recorded are the models' own
    for name in SIZES:
        assert dims[clients["model"] == name].iloc[0] == sum(
            p.numel() for p in build_model(name, (1, 8, 8), 10).parameters()
        )


@pytest.mark.slow
def test_inline_and_ray_executors_agree_exactly(ray_session, tmp_path):
    runs = [
        run_experiment(hetero(tmp_path, **{"runtime.executor": e}), tmp_path / e)
        for e in ("inline", "ray")
    ]
    columns = ["round", "client", "model", "loss", "accuracy", "bits_up", "bits_down"]
    frames = [pd.read_parquet(r / "clients.parquet")[columns] for r in runs]
    pd.testing.assert_frame_equal(*frames)
    norms = [pd.read_parquet(r / "maps.parquet") for r in runs]
    pd.testing.assert_frame_equal(*norms)


@pytest.mark.slow
def test_the_maps_survive_a_checkpoint_and_resume_gives_the_same_run(ray_session, tmp_path):
    whole = run_experiment(hetero(tmp_path, rounds=4), tmp_path / "whole")
    cut = run_experiment(hetero(tmp_path, rounds=4), tmp_path / "cut", stop_after=3)
    resumed = resume_experiment(cut)  # from the round-2 checkpoint: maps reloaded, not redrawn
    columns = ["round", "client", "loss", "accuracy", "bits_up"]
    frames = [pd.read_parquet(r / "clients.parquet")[columns] for r in (whole, resumed)]
    pd.testing.assert_frame_equal(*frames)
    norms = [pd.read_parquet(r / "maps.parquet") for r in (whole, resumed)]
    pd.testing.assert_frame_equal(*norms)


def test_dfedu_and_dpsgd_refuse_models_that_differ(tmp_path):

    for name in ("dfedu", "dpsgd"):
        with pytest.raises(ConfigError, match=f"algorithm.name: {name} needs every client"):
            hetero(tmp_path, **{"algorithm.name": name, "algorithm.params": {}})


def test_with_identity_maps_a_round_is_a_dfedu_round(tmp_path):
    from raymtl.runtime import run_experiment

    common = {
        "rounds": 1,
        "topology.kind": "erdos_renyi",
        "topology.params": {"p": 0.5},
        "model.name": "logreg",
    }
    sheaf_params = {"lr": 0.1, "lam": 0.5, "gamma": 1.0, "map_init": "identity"}
    sheaf_params |= {"map_lr": 0.0, "l2": 0.0}
    dfedu_params = {"lr": 0.1, "lam": 0.5, "epochs": 1, "similarity": "ones"}
    runs = {}
    for name, params in (("sheaf_fmtl", sheaf_params), ("dfedu", dfedu_params)):
        settings = {**common, "algorithm.name": name, "algorithm.params": params}
        runs[name] = run_experiment(
            parse_config(digits_experiment(tmp_path, **settings)), tmp_path / name
        )
    sheaf_rows, dfedu_rows = (pd.read_parquet(d / "clients.parquet") for d in runs.values())
    pd.testing.assert_series_equal(sheaf_rows["loss"], dfedu_rows["loss"], rtol=1e-5, atol=1e-7)
    assert (sheaf_rows["accuracy"] == dfedu_rows["accuracy"]).all()
