"""runtime.autoscale on Ray's fake multi-node autoscaler (the provider Ray tests its
autoscaler with on one machine): a head of 1 CPU, and a worker type of 2 CPUs (at most 2).

  grows      6 clients, clients_per_actor 2: 3 client actors of 1 CPU; the head holds one.
             raymtl asks the autoscaler for 3 bundles of 1 CPU (request_resources), a
             worker comes up, the run finishes with its actors on both nodes; once it has
             ended the request is withdrawn and the idle worker is removed.
  never      6 client actors of 1 CPU: more than the head and both workers hold (5 CPUs);
             the run stops in one line within runtime.placement_timeout_s.

`ray.cluster_utils.AutoscalingCluster` is that harness, but its `start()` runs `ray stop
--force` (every Ray of this user on the machine: other runs, the test session's) and this
Ray's wheel lacks the example.yaml it reads. The cluster here is the same: `ray start --head`
with RAY_FAKE_CLUSTER=1 and an autoscaling config of provider `fake_multinode`, on free ports
and a temporary folder of its own; only the processes started for it are ended.

Run in its own process (one Ray per process), which prints one JSON line (`AUTOSCALING {...}`):
    python -m tests.integration.test_autoscaling OUT_DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from raymtl.config import ConfigError

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

HEAD_CPUS = 1
WORKER = {"CPU": 2, "object_store_memory": 200_000_000}
SETTINGS = {
    "runtime.executor": "ray",
    "runtime.autoscale": True,
    "data.num_clients": 6,
    "runtime.clients_per_actor": 2,
    "rounds": 2,
    "runtime.placement_timeout_s": 60,
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def autoscaling_config(gcs_address: str) -> dict:
    """The fake provider's cluster: the head and one worker type (Ray's example.yaml)."""
    return {
        "cluster_name": "raymtl_fake",
        "max_workers": 2,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs_address,  # else the workers look for a head on port 6379
        },
        "available_node_types": {
            "ray.head.default": {
                "resources": {"CPU": HEAD_CPUS},
                "node_config": {},
                "max_workers": 0,
            },
            "ray.worker.cpu": {
                "resources": WORKER,
                "node_config": {},
                "min_workers": 0,
                "max_workers": 2,
            },
        },
        "head_node_type": "ray.head.default",
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.05,  # an idle worker goes after 3 s
        "docker": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }


def processes_naming(text: str) -> list[int]:
    """The ids of the processes whose command line holds `text` (the cluster's folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in command:
            found.append(int(entry))
    return found


class FakeAutoscalingCluster:
    """A head started with the fake multi-node autoscaler; `stop()` ends its processes."""

    def __init__(self):
        import ray._private.services

        self.folder = tempfile.mkdtemp(prefix="rmas", dir="/tmp")  # short: Unix socket paths
        ip = ray._private.services.get_node_ip_address()
        self.address = f"{ip}:{free_port()}"
        config = Path(self.folder, "autoscaling.json")
        config.write_text(json.dumps(autoscaling_config(self.address)))
        ports = ("dashboard-agent-listen", "dashboard-agent-grpc", "runtime-env-agent")
        ports += ("metrics-export", "ray-client-server")
        command = [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            f"--autoscaling-config={config}",
            f"--port={self.address.rsplit(':', 1)[1]}",
            f"--num-cpus={HEAD_CPUS}",
            "--object-store-memory=200000000",
            f"--temp-dir={self.folder}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            *(f"--{port}-port={free_port()}" for port in ports),
        ]
        env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        log = open(Path(self.folder, "head.log"), "w")  # noqa: SIM115 (closed by stop)
        self.head = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        self._log = log

    def stop(self) -> None:
        for pid in processes_naming(self.folder):
            if pid != self.head.pid:
                with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                    os.kill(pid, signal.SIGKILL)
        self.head.kill()
        self.head.wait()
        self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def nodes_alive(ray) -> int:
    return sum(node["Alive"] for node in ray.nodes())


def scenario(out: Path) -> dict:
    import pandas as pd
    import ray

    from raymtl.config import parse_config
    from raymtl.runtime import run_experiment
    from raymtl.runtime.faults import RunStopped
    from tests.conftest import digits_experiment

    cluster = FakeAutoscalingCluster()
    try:
        for _ in range(60):  # the head takes a few seconds to come up
            try:
                ray.init(address=cluster.address, log_to_driver=False)
                break
            except Exception:  # not up yet
                time.sleep(1.0)
        nodes_before = nodes_alive(ray)
        settings = {**SETTINGS, "runtime.address": cluster.address}
        began = time.monotonic()
        run_dir = Path(
            run_experiment(parse_config(digits_experiment(out, **settings)), out / "grows")
        )
        seconds = time.monotonic() - began
        hosts = pd.read_parquet(run_dir / "hosts.parquet")
        clients = hosts[hosts["host"].str.startswith("clients-")]
        rounds = pd.read_parquet(run_dir / "rounds.parquet")
        nodes_during = nodes_alive(ray)
        deadline = time.monotonic() + 60
        while nodes_alive(ray) > nodes_before and time.monotonic() < deadline:
            time.sleep(1.0)  # the request withdrawn, the idle worker is removed
        nodes_after = nodes_alive(ray)
        never = {**settings, "runtime.clients_per_actor": 1, "runtime.placement_timeout_s": 15}
        try:
            run_experiment(parse_config(digits_experiment(out, **never)), out / "never")
            stopped = None
        except RunStopped as error:
            stopped = str(error)
        return {
            "nodes_before": nodes_before,
            "nodes_during": nodes_during,
            "nodes_after": nodes_after,
            "client_nodes": int(clients["node"].nunique()),
            "client_actors": int(len(clients)),
            "rounds": int(rounds["round"].max()),
            "seconds": seconds,
            "stopped": stopped,
        }
    finally:
        ray.shutdown()
        cluster.stop()


@pytest.fixture(scope="module")
def autoscaled(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("autoscaling")
    result = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_autoscaling", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},  # a test cluster of its own
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("AUTOSCALING ")]
    return json.loads(line.removeprefix("AUTOSCALING "))


@pytest.mark.ray
@pytest.mark.slow
def test_a_federation_larger_than_the_head_finishes_on_added_nodes(autoscaled):
    assert autoscaled["nodes_before"] == 1  # the head alone: 1 CPU, one client actor
    assert autoscaled["rounds"] == 2 and autoscaled["client_actors"] == 3
    assert autoscaled["nodes_during"] >= 2 and autoscaled["client_nodes"] >= 2


@pytest.mark.ray
@pytest.mark.slow
def test_once_the_run_ends_the_idle_workers_are_removed(autoscaled):
    assert autoscaled["nodes_after"] == 1


@pytest.mark.ray
@pytest.mark.slow
def test_room_that_never_comes_is_one_line_within_the_wait(autoscaled):
    assert autoscaled["stopped"] == (
        "runtime.autoscale: the autoscaler did not bring up room for 6 client actors of 1 CPU "
        "within runtime.placement_timeout_s: 15 s; the 3 nodes alive have 5 CPUs"
    )


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            {},
            "runtime.autoscale: needs a whole-number clients_per_actor (auto sizes the "
            "federation by the CPUs up now, so the autoscaler is never asked to grow)",
        ),
        (
            {"runtime.clients_per_actor": 2, "runtime.executor": "inline"},
            "runtime.autoscale: needs executor: ray",
        ),
    ],
)
def test_autoscaling_without_a_size_or_without_ray_is_one_line(make_config, settings, line):
    with pytest.raises(ConfigError) as refused:
        make_config(**{"runtime.executor": "ray", "runtime.autoscale": True, **settings})
    assert str(refused.value) == line


if __name__ == "__main__":
    print("AUTOSCALING " + json.dumps(scenario(Path(sys.argv[1]))), flush=True)
