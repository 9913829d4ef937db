"""runtime.inject_faults: hosts' Ray actors killed on purpose at the start of the rounds it
names. The recovery is a real fault's (roll back to the last complete checkpoint and replay,
or go on without the lost clients under min_clients_fraction < 1), so the finished run
equals the fault-free one; each kill is a faults.parquet row marked `injected`, and a
(round, host) is killed once, never again on the replay of its round."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from raymtl.config import ConfigError
from raymtl.runtime import resume_experiment, run_experiment
from raymtl.runtime.faults import RunStopped, injection_schedule

CLIENT_COLUMNS = ["seed", "round", "client", "loss", "accuracy", "bits_up", "bits_down"]
SETTINGS = {
    "runtime.executor": "ray",
    "rounds": 4,
    "checkpoint_every": 2,
    "runtime.clients_per_actor": 3,
}
HOSTS = ["clients-0", "clients-1", "clients-2", "clients-3", "clients-4", "server"]


def clients_table(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "clients.parquet")
    return frame.sort_values(CLIENT_COLUMNS[:3]).reset_index(drop=True)[CLIENT_COLUMNS]


def faults(run_dir: Path) -> list[dict]:
    return pd.read_parquet(run_dir / "faults.parquet").to_dict("records")


# -- the schedule (no Ray)
def test_a_named_host_is_killed_at_its_round(make_config):
    cfg = make_config(
        **{"runtime.inject_faults": [{"kill": "host", "host": "server", "round": 2}], **SETTINGS}
    )
    assert injection_schedule(cfg.runtime.inject_faults, HOSTS, 4) == {2: ["server"]}


def test_a_share_of_the_client_actors_is_drawn_from_its_seed(make_config):
    def schedule(share, seed):
        fault = {"kill": "clients", "share": share, "seed": seed}
        cfg = make_config(**{"runtime.inject_faults": [fault], **SETTINGS})
        return injection_schedule(cfg.runtime.inject_faults, HOSTS, 10)

    drawn = schedule(0.4, 7)  # 0.4 x 5 client actors: 2 of them, never the server
    killed = [host for hosts in drawn.values() for host in hosts]
    assert len(killed) == 2 and len(set(killed)) == 2 and "server" not in killed
    assert all(1 <= round_index <= 10 for round_index in drawn)
    assert schedule(0.4, 7) == drawn  # seeded: the same draw every time
    assert len([h for hosts in schedule(0.01, 7).values() for h in hosts]) == 1  # at least one
    assert sum(len(hosts) for hosts in schedule(1.0, 3).values()) == 5  # every client actor
    draws = {
        tuple(sorted((r, h) for r, hs in schedule(0.2, s).items() for h in hs)) for s in range(8)
    }
    assert len(draws) > 1  # another seed, another draw


@pytest.mark.parametrize(
    ("fault", "line"),
    [
        (
            {"kill": "host", "host": "clients-9", "round": 2},
            "runtime.inject_faults.0.host: 'clients-9' is not a host of this federation (its "
            "hosts: clients-0, clients-1, clients-2, clients-3, clients-4, server)",
        ),
        (
            {"kill": "host", "host": "server", "round": 5},
            "runtime.inject_faults.0.round: 5 is after the last round (4)",
        ),
    ],
)
def test_a_fault_the_federation_cannot_have_is_one_line(make_config, fault, line):
    cfg = make_config(**{"runtime.inject_faults": [fault], **SETTINGS})
    with pytest.raises(ConfigError) as refused:
        injection_schedule(cfg.runtime.inject_faults, HOSTS, 4)
    assert str(refused.value) == line


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            {"runtime.executor": "inline"},
            "runtime.inject_faults: needs executor: ray (a fault kills a host's Ray actor; "
            "the inline executor's hosts share this process)",
        ),
        (
            {"runtime.inject_faults": [{"kill": "node"}]},
            "runtime.inject_faults.kill: 'node' (fault 0) is not a fault; give {kill: "
            "clients, share: 0.2, seed: 7} or {kill: host, host: clients-1, round: 3}",
        ),
        (
            {"runtime.inject_faults": [{"kill": "clients", "share": 0}]},
            "runtime.inject_faults.0.clients.share: Input should be greater than 0",
        ),
    ],
)
def test_bad_fault_settings_are_one_line(make_config, settings, line):
    fault = [{"kill": "host", "host": "server", "round": 2}]
    with pytest.raises(ConfigError) as refused:
        make_config(**{"runtime.executor": "ray", "runtime.inject_faults": fault, **settings})
    assert str(refused.value) == line


# -- real kills on the shared local Ray
@pytest.mark.ray
@pytest.mark.cluster
def test_an_injected_fault_is_recovered_once_with_identical_results(
    ray_session, make_config, reference_run, tmp_path
):
    whole = reference_run(**SETTINGS, **{"algorithm.name": "fedavg"})
    fault = {"kill": "host", "host": "clients-1", "round": 3}
    cfg = make_config(**SETTINGS, **{"runtime.max_restarts": 1, "runtime.inject_faults": [fault]})
    faulty = run_experiment(cfg, tmp_path / "faulty")  # one recovery: a second kill would stop it
    pd.testing.assert_frame_equal(clients_table(whole), clients_table(faulty))
    (row,) = faults(faulty)  # killed in round 3, not again when round 3 was replayed
    assert row["host"] == "clients-1" and row["round"] == 3 and row["injected"]
    assert row["rolled_back_to"] == 2 and row["action"] == "rolled back to round 2, replaying"
    assert row["node"] not in ("", "?") and row["seconds_lost"] > 0


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.cluster
def test_a_resumed_run_does_not_kill_again(ray_session, make_config, tmp_path):
    """Stopped (as a crash) after round 3, whose start killed clients-1: the resumed run
    replays round 3 from the round-2 checkpoint and kills nobody."""
    fault = {"kill": "host", "host": "clients-1", "round": 3}
    cfg = make_config(**SETTINGS, **{"runtime.max_restarts": 1, "runtime.inject_faults": [fault]})
    run_dir = run_experiment(cfg, tmp_path / "run", stop_after=3)
    assert len(faults(run_dir)) == 1
    resume_experiment(run_dir)
    (row,) = faults(run_dir)
    assert row["host"] == "clients-1" and row["round"] == 3 and row["injected"]
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert sorted(rounds["round"]) == [1, 2, 3, 4]


@pytest.mark.ray
@pytest.mark.cluster
def test_without_restarts_an_injected_fault_stops_the_run(ray_session, make_config, tmp_path):
    fault = {"kill": "host", "host": "server", "round": 2}
    cfg = make_config(**SETTINGS, **{"runtime.inject_faults": [fault]})
    with pytest.raises(RunStopped) as stopped:
        run_experiment(cfg, tmp_path / "run")
    assert str(stopped.value).startswith(
        "runtime.max_restarts: 0 recoveries used up; seed 0 round 2"
    )
    (row,) = faults(tmp_path / "run")
    assert row["action"] == "run stopped" and row["host"] == "server" and row["injected"]


@pytest.mark.ray
@pytest.mark.cluster
def test_with_clients_to_spare_the_run_goes_on_without_the_killed_actor(
    ray_session, make_config, tmp_path
):
    fault = {"kill": "host", "host": "clients-0", "round": 2}
    settings = {"runtime.min_clients_fraction": 0.5, "runtime.inject_faults": [fault]}
    run_dir = run_experiment(make_config(**SETTINGS, **settings), tmp_path / "run")
    (row,) = faults(run_dir)
    assert row["host"] == "clients-0" and row["round"] == 2 and row["injected"]
    assert row["action"] == "continued without client/0, client/1, client/2"
    rounds = pd.read_parquet(run_dir / "rounds.parquet").sort_values("round")
    assert rounds["clients_answered"].tolist() == [6, 3, 3, 3]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.cluster
def test_a_fifth_of_the_client_actors_killed_changes_no_result(ray_session, make_config, tmp_path):
    """The benchmark's run, small: 5 client actors of one client, a fifth of them (one, at
    a round drawn from seed 7) killed; one recovery, the clients' results those of the
    fault-free run."""
    settings = {
        **SETTINGS,
        "data.num_clients": 5,
        "runtime.clients_per_actor": 1,
        "runtime.num_cpus_per_actor": 0.25,
    }
    whole = run_experiment(make_config(**settings), tmp_path / "whole")
    fault = {"kill": "clients", "share": 0.2, "seed": 7}
    cfg = make_config(**settings, **{"runtime.max_restarts": 1, "runtime.inject_faults": [fault]})
    (planned,) = injection_schedule(cfg.runtime.inject_faults, HOSTS, 4).items()
    faulty = run_experiment(cfg, tmp_path / "faulty")
    pd.testing.assert_frame_equal(clients_table(whole), clients_table(faulty))
    (row,) = faults(faulty)
    assert (row["round"], [row["host"]]) == planned and row["injected"]
    assert row["action"].startswith("rolled back to round")
