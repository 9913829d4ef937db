"""Faults on one shared local Ray: a lost host (client actor, server, LPS, graph service) rolls
the whole federation back to its last complete checkpoint and the lost rounds are replayed, so
the finished run equals the fault-free one; faults.parquet and summary.json say what happened.
The loss of a whole node is tested on a `ray.cluster_utils.Cluster` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from raymtl.runtime import run_experiment

pytestmark = pytest.mark.ray

SETTINGS = {"runtime.executor": "ray", "rounds": 4, "checkpoint_every": 2,
            "runtime.clients_per_actor": 3}  # fmt: skip
HOSTS = {
    "clients-0": {"algorithm.name": "fedavg"},
    "server": {"algorithm.name": "fedavg"},
    "lps-1": {"algorithm.name": "hfedavg", "topology.kind": "hierarchical"},
    "graph": {"algorithm.name": "sfmtl_graph", "algorithm.params": {"epochs": 1}},
}
CLIENT_COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]


def kill_once(ray, host: str, after_round: int, killed: list):
    """A progress callback killing raymtl host `host`'s actor (no restart) the first time
    round `after_round` completes."""

    def kill(seed, round_index, row):
        if round_index != after_round or killed:
            return
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        (victim,) = [n for n in names if n.startswith("raymtl-") and n.endswith(f"-{host}")]
        ray.kill(ray.get_actor(victim), no_restart=True)
        killed.append(victim)

    return kill


def table(run_dir: Path, name: str, columns: list[str]) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / f"{name}.parquet")
    return frame.sort_values(columns[:3]).reset_index(drop=True)[columns]


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_a_lost_host_is_recovered_with_identical_results(ray_session, make_config, tmp_path, host):
    settings = {**SETTINGS, **HOSTS[host]}
    whole = run_experiment(make_config(**settings), tmp_path / "whole")
    killed = []
    cfg = make_config(**settings, **{"runtime.max_restarts": 1})
    recovered = run_experiment(cfg, tmp_path / "faulty", kill_once(ray_session, host, 3, killed))
    assert killed  # round 3 was lost with the host; the round-2 checkpoint is the last complete
    pd.testing.assert_frame_equal(table(whole, "clients", CLIENT_COLUMNS),
                                  table(recovered, "clients", CLIENT_COLUMNS))  # fmt: skip
    message_columns = ["seed", "round", "src", "dst", "kind", "bits"]
    pd.testing.assert_frame_equal(table(whole, "messages", message_columns),
                                  table(recovered, "messages", message_columns))  # fmt: skip
    (fault,) = pd.read_parquet(recovered / "faults.parquet").to_dict("records")
    assert fault["host"] == host and fault["round"] == 4 and fault["rolled_back_to"] == 2
    assert fault["action"].startswith("rolled back") and fault["node"] not in ("", "?")
    faults = json.loads((recovered / "summary.json").read_text())["faults"]
    assert faults["recoveries"] == 1 and faults["rounds_replayed"] == 1


def test_without_restarts_left_a_lost_host_ends_the_run_with_one_line(ray_session, make_config,
                                                                      tmp_path):  # fmt: skip
    killed = []
    with pytest.raises(RuntimeError, match=r"^runtime.max_restarts: 0 recoveries used up; hosts"):
        run_experiment(make_config(**SETTINGS), tmp_path / "run",
                       kill_once(ray_session, "clients-0", 1, killed))  # fmt: skip
    (fault,) = pd.read_parquet(tmp_path / "run" / "faults.parquet").to_dict("records")
    assert fault["action"] == "run stopped"


@pytest.mark.slow
def test_a_lost_worker_node_is_recovered_on_the_nodes_left(tmp_path):
    script = "tests.integration.cluster_node_loss"
    result = subprocess.run([sys.executable, "-m", script, str(tmp_path)], capture_output=True,
                            text=True, timeout=600, cwd=Path(__file__).parents[2])  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "identical" in result.stdout


def test_a_run_may_go_on_without_lost_clients_and_resume_exactly_that_federation(
    ray_session, make_config, tmp_path
):
    """min_clients_fraction 0.5: clients-0's three clients are lost after round 1 for good."""
    settings = {**SETTINGS, "runtime.min_clients_fraction": 0.5, "checkpoint_every": 1}
    killed = []
    cfg = make_config(**settings)
    run_dir = run_experiment(cfg, tmp_path / "run", kill_once(ray_session, "clients-0", 1, killed),
                             stop_after=3)  # fmt: skip
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert rounds["clients_answered"].tolist() == [6, 3, 3]
    assert rounds["clients_lost"].tolist() == [0, 3, 3]
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert set(clients[clients["round"] > 1]["client"]) == {3, 4, 5}
    messages = pd.read_parquet(run_dir / "messages.parquet")
    later = messages[messages["round"] > 1]
    assert not set(later["dst"]) & {"client/0", "client/1", "client/2"}  # never delivered
    assert not set(later["src"]) & {"client/0", "client/1", "client/2"}
    (fault,) = pd.read_parquet(run_dir / "faults.parquet").to_dict("records")
    assert fault["action"] == "continued without client/0, client/1, client/2"
    complete = json.loads((run_dir / "checkpoints/seed0/round00003/COMPLETE").read_text())
    assert complete["lost"] == ["client/0", "client/1", "client/2"]
    assert not list((run_dir / "checkpoints/seed0/round00003").glob("client_0.pt"))
    from raymtl.runtime import resume_experiment

    resumed = resume_experiment(run_dir)  # rounds 4: the three survivors, as in the checkpoint
    rounds = pd.read_parquet(resumed / "rounds.parquet")
    assert rounds["clients_answered"].tolist() == [6, 3, 3, 3]
    last = pd.read_parquet(resumed / "clients.parquet")
    assert set(last[last["round"] == 4]["client"]) == {3, 4, 5}


def test_a_run_kept_at_a_uri_recovers_and_resumes_from_it(ray_session, make_config, tmp_path,
                                                           monkeypatch):  # fmt: skip
    """output.dir as a URI (file:// here; s3://, gs:// go through the same pyarrow.fs calls):
    the hosts write their checkpoints there, the driver publishes its outputs there."""
    monkeypatch.setattr("raymtl.runtime.run_dirs.DEFAULT_CACHE_ROOT", str(tmp_path / "cache"))
    import raymtl

    whole = run_experiment(make_config(**SETTINGS), tmp_path / "whole")
    killed = []
    uri = f"file://{tmp_path}/remote"
    cfg = make_config(**SETTINGS, **{"runtime.max_restarts": 1, "output.dir": uri})
    run_uri = run_experiment(cfg, progress=kill_once(ray_session, "clients-0", 3, killed))
    assert killed and isinstance(run_uri, str) and run_uri.startswith(uri)
    remote = Path(run_uri.removeprefix("file://"))
    for name in ("config.yaml", "rounds.parquet", "clients.parquet", "summary.json",
                 "faults.parquet", "checkpoints/seed0/round00002/COMPLETE",
                 "checkpoints/seed0/round00002/index-client_0.json",  # FedAvg clients keep nothing
                 "checkpoints/seed0/round00002/server.pt", "checkpoints/seed0/DONE"):  # fmt: skip
        assert (remote / name).is_file(), name
    pd.testing.assert_frame_equal(table(whole, "clients", CLIENT_COLUMNS),
                                  table(remote, "clients", CLIENT_COLUMNS))  # fmt: skip
    longer = raymtl.resume(run_uri, overrides=["rounds=5"])
    assert longer.uri == run_uri and longer.rounds["round"].tolist() == [1, 2, 3, 4, 5]
    assert raymtl.load_results(run_uri).rounds["round"].tolist() == [1, 2, 3, 4, 5]
