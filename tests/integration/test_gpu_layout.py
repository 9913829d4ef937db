"""GPU shares on the test session's Ray, which declares one GPU (a resource count: torch sees
none, so `device: auto` trains on the CPU). `clients_per_actor: auto` lays the client actors
out by GPUs as well as CPUs; a layout that cannot fit is refused before any actor starts, in
one line, within 2 s; and `placement_timeout_s` bounds only the wait for room, never the wait
for an actor Ray has placed and whose process is still starting."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from raymtl.config import RuntimeConfig
from raymtl.runtime import run_experiment
from raymtl.runtime.faults import RunStopped
from tests.conftest import layout_refused_at_once

pytestmark = pytest.mark.ray

SETTINGS = {
    "runtime.executor": "ray",
    "data.num_clients": 8,
    "rounds": 1,
    "runtime.num_cpus_per_actor": 0.25,
    "runtime.placement_timeout_s": 20,
}


def client_hosts(run_dir: Path) -> pd.DataFrame:
    hosts = pd.read_parquet(run_dir / "hosts.parquet")
    return hosts[hosts["host"].str.startswith("clients-")]


@pytest.mark.cluster
@pytest.mark.parametrize(("share", "actors"), [(0.25, 4), (0.3, 3)])
def test_auto_lays_client_actors_out_by_gpus(ray_session, make_config, tmp_path, share, actors):
    """8 CPUs' worth of quarter-CPU actors, but one GPU: 4 actors of a quarter GPU, or 3 of
    0.3; every actor asked Ray for its share, and the run finishes."""
    cfg = make_config(**SETTINGS, **{"runtime.num_gpus_per_actor": share})
    run_dir = run_experiment(cfg, tmp_path / "run")
    clients = client_hosts(run_dir)
    assert len(clients) == actors
    assert set(clients["num_gpus"]) == {share}
    assert set(clients["device"]) == {"cpu"}  # torch sees no GPU in them
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert rounds["round"].tolist() == [1]


def test_gpu_shares_that_cannot_fit_are_refused_in_one_line_at_once(
    ray_session, make_config, tmp_path
):
    """8 actors of 0.3 GPU (clients_per_actor: 1) need 2.4 GPUs: refused before any actor
    starts, not left waiting for room that never comes."""
    settings = {**SETTINGS, "runtime.num_gpus_per_actor": 0.3, "runtime.clients_per_actor": 1}
    line = layout_refused_at_once(make_config(**settings), tmp_path / "run")
    assert line == (
        "runtime.clients_per_actor: 1 makes 8 client actors of 0.25 CPU and 0.3 GPU for 8 "
        "clients; this machine's Ray has 2 CPUs and 1 GPU, room for 3 (1.4 GPUs missing); "
        "give clients_per_actor: 3 or auto, or ask less of each actor "
        "(runtime.num_cpus_per_actor, num_gpus_per_actor)"
    )


def slow_starter(ray, seconds: float, gpus: float = 0.0):
    """An actor whose process takes `seconds` to start (as one importing torch on a busy
    machine), answering `ping` as a host does."""

    @ray.remote(num_cpus=0, num_gpus=gpus)
    class SlowStart:
        def __init__(self):
            time.sleep(seconds)

        def ping(self):
            return True

    return SlowStart.remote()


def test_a_placed_actor_is_waited_for_past_the_placement_timeout(ray_session):
    from raymtl.runtime.executors.ray_executor import RayExecutor

    executor = RayExecutor(RuntimeConfig(placement_timeout_s=3))
    executor.hosts = {"clients-0": slow_starter(ray_session, 7.0)}
    began = time.perf_counter()
    executor._await_placement(["clients-0"])  # no RunStopped: it was placed, and started
    assert time.perf_counter() - began >= 6.5
    assert executor.placed == {"clients-0"}
    ray_session.kill(executor.hosts["clients-0"])


def test_an_actor_no_node_can_place_stops_the_run_after_the_timeout(ray_session):
    """An actor asking for 2 GPUs of a Ray with 1: the timeout is the wait for room."""
    from raymtl.runtime.executors.ray_executor import RayExecutor

    executor = RayExecutor(RuntimeConfig(placement_timeout_s=2))
    executor.hosts = {"clients-0": slow_starter(ray_session, 0.0, gpus=2.0)}
    began = time.perf_counter()
    with pytest.raises(RunStopped, match="not placed within runtime.placement_timeout_s: 2 s"):
        executor._await_placement(["clients-0"])
    assert time.perf_counter() - began < 6
    ray_session.kill(executor.hosts["clients-0"])
