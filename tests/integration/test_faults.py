"""Faults on one shared local Ray: a lost host (client actor, server, LPS, graph service) rolls
the whole federation back to its last complete checkpoint and the lost rounds are replayed, so
the finished run equals the fault-free one; faults.parquet and summary.json say what happened.
A run that cannot go on (recoveries used up) stops in one line (`RunStopped`; exit code 3 on
the command line); actors no node of the local Ray can hold are refused at once. Crashed
nodes are tested on a `ray.cluster_utils.Cluster` in a subprocess (cluster_node_loss.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from raymtl.cli import app
from raymtl.runtime import run_experiment
from raymtl.runtime.faults import RunStopped
from tests.conftest import actor_serving, layout_refused_at_once, write_experiment

pytestmark = pytest.mark.ray

SETTINGS = {
    "runtime.executor": "ray",
    "rounds": 4,
    "checkpoint_every": 2,
    "runtime.clients_per_actor": 3,
}
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
        ray.kill(actor_serving(ray, host), no_restart=True)
        killed.append(host)

    return kill


def table(run_dir: Path, name: str, columns: list[str]) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / f"{name}.parquet")
    return frame.sort_values(columns[:3]).reset_index(drop=True)[columns]


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.cluster
def test_a_lost_host_is_recovered_with_identical_results(
    ray_session, make_config, reference_run, tmp_path, host
):
    settings = {**SETTINGS, **HOSTS[host]}
    whole = reference_run(**settings)
    killed = []
    cfg = make_config(**settings, **{"runtime.max_restarts": 1})
    recovered = run_experiment(cfg, tmp_path / "faulty", kill_once(ray_session, host, 3, killed))
    assert killed  # round 3 was lost with the host; the round-2 checkpoint is the last complete
    pd.testing.assert_frame_equal(
        table(whole, "clients", CLIENT_COLUMNS), table(recovered, "clients", CLIENT_COLUMNS)
    )
    message_columns = ["seed", "round", "src", "dst", "kind", "bits"]
    pd.testing.assert_frame_equal(
        table(whole, "messages", message_columns), table(recovered, "messages", message_columns)
    )
    (fault,) = pd.read_parquet(recovered / "faults.parquet").to_dict("records")
    assert fault["host"] == host and fault["round"] == 4 and fault["rolled_back_to"] == 2
    assert fault["action"].startswith("rolled back") and fault["node"] not in ("", "?")
    faults = json.loads((recovered / "summary.json").read_text())["faults"]
    assert faults["recoveries"] == 1 and faults["rounds_replayed"] == 1


@pytest.mark.cluster
def test_the_replay_starts_a_new_actor_only_for_the_lost_host(ray_session, make_config, tmp_path):
    """The hosts that still answer keep their actors through the rollback; the results are
    the fault-free run's (the test above)."""
    hosts, before, killed = ("clients-0", "clients-1", "server"), {}, []

    def kill(seed, round_index, row):
        if round_index != 1 or killed:
            return
        actors = {host: actor_serving(ray_session, host) for host in hosts}
        before.update({host: actor._actor_id.hex() for host, actor in actors.items()})
        ray_session.kill(actors["clients-0"], no_restart=True)
        killed.append("clients-0")

    cfg = make_config(**SETTINGS, **{"algorithm.name": "fedavg", "runtime.max_restarts": 1})
    run_dir = run_experiment(cfg, tmp_path / "run", kill)
    (fault,) = pd.read_parquet(run_dir / "faults.parquet").to_dict("records")
    assert fault["host"] == "clients-0" and fault["action"] == "rolled back to round 0, replaying"
    after = pd.read_parquet(run_dir / "hosts.parquet").set_index("host")["actor"].to_dict()
    assert set(after) == set(hosts)
    assert after["clients-0"] != before["clients-0"]
    assert after["clients-1"] == before["clients-1"] and after["server"] == before["server"]


@pytest.mark.cluster
def test_without_restarts_left_a_lost_host_stops_the_run_in_one_line(
    ray_session, make_config, tmp_path
):
    killed = []
    kill = kill_once(ray_session, "clients-0", 1, killed)
    with pytest.raises(RunStopped) as stopped:
        run_experiment(make_config(**SETTINGS), tmp_path / "run", kill)
    (line,) = str(stopped.value).splitlines()
    assert line.startswith("runtime.max_restarts: 0 recoveries used up; seed 0 round 2: ")
    assert "hosts lost during run_phase: clients-0 (node " in line
    (fault,) = pd.read_parquet(tmp_path / "run" / "faults.parquet").to_dict("records")
    assert fault["action"] == "run stopped" and fault["host"] == "clients-0"


CRASHING_PLUGIN = """
import os

from raymtl.extend import FedAvg, register_algorithm


@register_algorithm
class CrashingFedAvg(FedAvg):
    name = "crashing_fedavg"
    summary = "FedAvg whose client 0 crashes its host's process in round 2"

    def train(self, state, inbox, ctx):
        if ctx.round == 2 and ctx.me == "client/0":
            os._exit(1)
        return super().train(state, inbox, ctx)
"""


# Ray's own log lines on stderr (its start-up): `2026-01-01 10:00:00,000<TAB>INFO ...`.
@pytest.mark.cluster
def test_recoveries_used_up_is_one_line_and_exit_code_3(ray_session, tmp_path, monkeypatch):
    """`raymtl run` as a user meets it: a client host's process crashes in round 2 and
    runtime.max_restarts is 0."""
    (tmp_path / "crash_once.py").write_text(CRASHING_PLUGIN)
    settings = {"algorithm.name": "crashing_fedavg", "runtime.executor": "ray"}
    path = write_experiment(tmp_path, plugins=["crash_once.py"], **settings)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 3, result.output[-3000:]
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    (line,) = lines
    assert line.startswith("error: runtime.max_restarts: 0 recoveries used up; seed 0 round 2:")
    assert "hosts lost during run_phase: clients-0" in line


def test_actors_no_node_can_hold_are_refused_at_once(ray_session, make_config, tmp_path):
    """Client actors of 3 CPUs on the 2-CPU local Ray: its size is known, so the layout is
    refused before any actor starts, in one line, without waiting out the timeout."""
    settings = {**SETTINGS, "runtime.num_cpus_per_actor": 3, "runtime.placement_timeout_s": 20}
    line = layout_refused_at_once(make_config(**settings), tmp_path / "run")
    assert line == (
        "runtime: not one client actor of 3 CPUs fits: this machine's Ray has 2 CPUs (1 CPU "
        "missing); give a smaller runtime.num_cpus_per_actor or num_gpus_per_actor"
    )


@pytest.fixture(scope="module")
def crashed_nodes(tmp_path_factory) -> dict[str, dict]:
    """cluster_node_loss.py's scenarios (one Cluster, in its own process): name -> what
    happened."""
    out = tmp_path_factory.mktemp("cluster")
    result = subprocess.run(
        [sys.executable, "-m", "tests.integration.cluster_node_loss", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("SCENARIO ")]
    scenarios = [json.loads(line.removeprefix("SCENARIO ")) for line in lines]
    return {scenario["name"]: scenario for scenario in scenarios}


@pytest.mark.slow
@pytest.mark.cluster
def test_a_crashed_node_costs_one_recovery(crashed_nodes):
    """2 nodes, max_restarts 1: the rollback waits for Ray to declare the node dead, so no
    new actor lands on it; the head holds them all."""
    scenario = crashed_nodes["one_recovery"]
    assert scenario["stopped"] is None and scenario["equal"]
    (fault,) = scenario["faults"]
    assert fault["node"] == scenario["node"] and fault["recovery"] == 1
    assert fault["round"] == 4 and fault["action"] == "rolled back to round 2, replaying"


@pytest.mark.slow
@pytest.mark.cluster
def test_a_crashed_node_without_replacement_is_replanned_onto_the_head(crashed_nodes):
    """4 client actors of 1 CPU on a 2-CPU head and a 2-CPU worker; the worker crashes: 2
    actors of 2 clients on the head, equal results, one line saying so."""
    scenario = crashed_nodes["replanned"]
    assert scenario["stopped"] is None and scenario["equal"]
    *lost, replanned = scenario["faults"]
    assert {fault["action"] for fault in lost} == {"rolled back to round 2, replaying"}
    assert {fault["node"] for fault in lost} == {scenario["node"]}
    assert replanned["host"] == "client actors" and replanned["round"] == 3
    assert replanned["action"] == (
        "re-planned: runtime.clients_per_actor: 1 -> 2: 4 client actors of 1 CPU do not fit "
        f"the 2 CPUs alive after node {scenario['node']} was lost; 2 actors of up to 2 clients do"
    )


@pytest.mark.slow
@pytest.mark.cluster
def test_a_layout_that_fits_no_node_left_stops_in_one_line_within_the_wait(crashed_nodes):
    """A client actor of 2.5 CPUs on the worker; the head has 2: nothing can hold it."""
    scenario = crashed_nodes["cannot_fit"]
    assert scenario["stopped"] == (
        "runtime: not one client actor of 2.5 CPUs fits the 2 CPUs alive after node "
        f"{scenario['node']} was lost; waited 10 s (runtime.placement_timeout_s)"
    )
    assert scenario["seconds_to_stop"] < 10 + 20  # the wait, and Ray declaring the node dead
    (fault,) = scenario["faults"]
    assert fault["action"] == "rolled back to round 2, replaying"


@pytest.mark.cluster
def test_a_run_may_go_on_without_lost_clients_and_resume_exactly_that_federation(
    ray_session, make_config, tmp_path
):
    """min_clients_fraction 0.5: clients-0's three clients are lost after round 1 for good."""
    settings = {**SETTINGS, "runtime.min_clients_fraction": 0.5, "checkpoint_every": 1}
    killed = []
    cfg = make_config(**settings)
    kill = kill_once(ray_session, "clients-0", 1, killed)
    run_dir = run_experiment(cfg, tmp_path / "run", kill, stop_after=3)
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


@pytest.mark.cluster
def test_a_run_kept_at_a_uri_recovers_and_resumes_from_it(
    ray_session, make_config, tmp_path, monkeypatch
):
    """output.dir as a URI (file:// here; s3://, gs:// go through the same pyarrow.fs calls):
    the hosts write their checkpoints there, the driver publishes its outputs there."""
    monkeypatch.setattr(
        "raymtl.runtime.storage.run_dirs.DEFAULT_CACHE_ROOT", str(tmp_path / "cache")
    )
    import raymtl

    whole = run_experiment(make_config(**SETTINGS), tmp_path / "whole")
    killed = []
    uri = f"file://{tmp_path}/remote"
    cfg = make_config(**SETTINGS, **{"runtime.max_restarts": 1, "output.dir": uri})
    run_uri = run_experiment(cfg, progress=kill_once(ray_session, "clients-0", 3, killed))
    assert killed and isinstance(run_uri, str) and run_uri.startswith(uri)
    remote = Path(run_uri.removeprefix("file://"))
    outputs = ["config.yaml", "rounds.parquet", "clients.parquet", "summary.json"]
    checkpoint = ["COMPLETE", "index-client_0.json", "server.pt"]  # FedAvg clients keep nothing
    outputs += [f"checkpoints/seed0/round00002/{name}" for name in checkpoint]
    for name in [*outputs, "faults.parquet", "checkpoints/seed0/DONE"]:
        assert (remote / name).is_file(), name
    pd.testing.assert_frame_equal(
        table(whole, "clients", CLIENT_COLUMNS), table(remote, "clients", CLIENT_COLUMNS)
    )
    longer = raymtl.resume(run_uri, overrides=["rounds=5"])
    assert longer.uri == run_uri and longer.rounds["round"].tolist() == [1, 2, 3, 4, 5]
    assert raymtl.load_results(run_uri).rounds["round"].tolist() == [1, 2, 3, 4, 5]
