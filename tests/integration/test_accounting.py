"""Bits on the wire and the federation's shape, through the InlineExecutor (no Ray)."""

from __future__ import annotations

import pandas as pd

from raymtl.models import build_model, num_params
from raymtl.runtime import run_experiment


def messages_of(run_dir) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "messages.parquet")


def test_fedavg_uplink_is_sampled_clients_times_parameters_times_32(make_config):
    cfg = make_config(**{"algorithm.params": {"sample_fraction": 0.5}, "rounds": 3})
    run_dir = run_experiment(cfg)
    params = num_params(build_model("cnn_mnist", (1, 8, 8), 10))
    messages = messages_of(run_dir)
    uplink = messages[messages["kind"] == "model"].groupby("round")["bits"].agg(["sum", "count"])
    assert list(uplink["count"]) == [3, 3, 3]  # ⌈0.5 · 6⌉ sampled clients
    assert list(uplink["sum"]) == [3 * params * 32] * 3
    # The model goes down to the 3 that trained; the other 3 get it only to be evaluated with
    # it (evaluation_only): not traffic.
    downlink = messages[messages["kind"] == "global_model"].groupby("round")
    assert list(downlink["bits"].sum()) == [3 * params * 32] * 3
    uploads = messages[messages["kind"] == "model"]
    for round_index, rows in downlink:
        assert set(rows["dst"]) == set(uploads[uploads["round"] == round_index]["src"])
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert list(rounds["bits_up"]) == [3 * params * 32] * 3
    assert list(rounds["cum_bits"]) == [6 * params * 32 * k for k in (1, 2, 3)]
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert len(clients.query("round == 3")) == 6  # all evaluated, with the global model
    assert (clients.query("round == 3")["bits_down"] > 0).sum() == 3


def test_local_transmits_nothing(make_config):
    run_dir = run_experiment(make_config(**{"algorithm.name": "local"}))
    assert messages_of(run_dir).empty
    assert pd.read_parquet(run_dir / "rounds.parquet")["cum_bits"].eq(0).all()


def test_dpsgd_messages_follow_the_graph_edges(make_config):
    cfg = make_config(
        **{
            "algorithm.name": "dpsgd",
            "topology.kind": "ring",
        }
    )
    run_dir = run_experiment(cfg)
    first_round = messages_of(run_dir).query("round == 1")
    links = set(zip(first_round["src"], first_round["dst"], strict=True))
    ring = {(f"client/{i}", f"client/{(i + d) % 6}") for i in range(6) for d in (1, -1)}
    assert links == ring
    assert set(first_round["src_role"]) == set(first_round["dst_role"]) == {"client"}


def test_hfedavg_uses_lps_and_global_rounds(make_config):
    cfg = make_config(
        **{
            "algorithm.name": "hfedavg",
            "algorithm.params": {"global_every": 2},
            "topology.num_lps": 2,
        }
    )
    messages = messages_of(run_experiment(cfg))
    per_round = messages.groupby("round")["kind"].apply(set)
    assert per_round[1] == {"model", "lps_model"}  # no GPS exchange on round 1
    assert per_round[2] == {"model", "lps_model", "common"}
    common = messages.query("kind == 'common'")
    assert set(common["src"]) | set(common["dst"]) == {"lps/0", "lps/1", "server"}
    params = build_model("cnn_mnist", (1, 8, 8), 10)
    conv_params = sum(
        p.numel() for n, p in params.named_parameters() if n.startswith("backbone.features")
    )
    assert set(common["bits"]) == {conv_params * 32}
