"""A run of Local over a mix of models records each client's model."""

from __future__ import annotations

import pandas as pd

from raymtl.config import parse_config
from tests.conftest import digits_experiment
from tests.unit.test_model_mix import MIX


def test_local_trains_a_mix_and_records_each_clients_model(tmp_path):
    from raymtl.runtime import run_experiment

    cfg = parse_config(digits_experiment(tmp_path, **MIX, **{"algorithm.name": "local"}))
    clients = pd.read_parquet(run_experiment(cfg) / "clients.parquet")
    last = clients[clients["round"] == 2].set_index("client")
    assert sorted(last["model"].value_counts().tolist()) == [3, 3]
    sizes = last.groupby("model")["model_params"].unique()
    assert len(sizes["mlp"]) == 1 and len(sizes["logreg"]) == 1
    assert sizes["mlp"][0] != sizes["logreg"][0]
    assert last["accuracy"].notna().all()
