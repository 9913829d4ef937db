"""Clients with different architectures inside shared Ray actors."""

from __future__ import annotations

import pandas as pd
import pytest

from raymtl.config import parse_config
from raymtl.runtime import run_experiment
from tests.conftest import digits_experiment

pytestmark = pytest.mark.ray


def test_each_client_actor_builds_the_models_of_its_own_clients(ray_session, tmp_path):
    settings = {
        "algorithm.name": "local",
        "model.name": "small_cnn",
        "model.mix": {"small_cnn": 0.34, "medium_cnn": 0.33, "large_cnn": 0.33},
        "runtime.executor": "ray",
        "runtime.clients_per_actor": 3,  # every actor holds clients of different models
    }
    run_dir = run_experiment(parse_config(digits_experiment(tmp_path, **settings)))
    clients = pd.read_parquet(run_dir / "clients.parquet")
    last = clients[clients["round"] == 2]
    assert sorted(last["model"].value_counts().tolist()) == [2, 2, 2]
    sizes = last.groupby("model")["model_params"].first()
    assert sizes["small_cnn"] < sizes["medium_cnn"] < sizes["large_cnn"]
    inline = run_experiment(
        parse_config(digits_experiment(tmp_path, **{**settings, "runtime.executor": "inline"}))
    )
    columns = ["client", "model", "model_params", "loss", "accuracy"]
    expected = pd.read_parquet(inline / "clients.parquet")
    pd.testing.assert_frame_equal(clients[columns], expected[columns])
