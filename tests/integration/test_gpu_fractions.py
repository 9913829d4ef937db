"""Fractional GPUs on a Ray that declares a GPU this CPU machine does not have: a
`ray.cluster_utils.Cluster` of a 1-CPU head and a worker of 2 CPUs and `num_gpus=1` (a plain
resource count to Ray). With `num_gpus_per_actor: 0.25` the four client actors share the
worker's one GPU; hosts.parquet records the layout (node, CPUs, GPU share, device). torch sees
no GPU in them, so `device: auto` trains on CPU and `device: cuda` is refused in one line
before any actor starts.

The Cluster runs in its own process (one Ray per process), which prints one JSON line
(`LAYOUT {...}`) read here:
    python -m tests.integration.test_gpu_fractions OUT_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raymtl.config import ConfigError
from raymtl.runtime.executors.layout import client_device

SETTINGS = {
    "runtime.executor": "ray",
    "data.num_clients": 4,
    "rounds": 2,
    "runtime.clients_per_actor": 1,
    "runtime.num_cpus_per_actor": 0.5,
    "runtime.num_gpus_per_actor": 0.25,
    "runtime.placement_timeout_s": 30,
}


def scenario(out: Path) -> dict:
    """Both runs on one Cluster: what hosts.parquet holds, and the refusal of cuda."""
    import pandas as pd
    import ray
    from ray.cluster_utils import Cluster

    from raymtl.config import ConfigError, parse_config
    from raymtl.runtime import run_experiment
    from tests.conftest import digits_experiment

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = cluster.add_node(num_cpus=2, num_gpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        settings = {**SETTINGS, "runtime.address": cluster.address}
        cfg = parse_config(digits_experiment(out, **settings))
        run_dir = run_experiment(cfg, out / "auto")
        hosts = pd.read_parquet(Path(run_dir) / "hosts.parquet")
        rounds = pd.read_parquet(Path(run_dir) / "rounds.parquet")
        cuda = parse_config(digits_experiment(out, **settings, **{"runtime.device": "cuda"}))
        try:
            run_experiment(cuda, out / "cuda")
            refusal = None
        except ConfigError as error:
            refusal = str(error)
        return {
            "worker": worker.node_id,
            "head": cluster.head_node.node_id,
            "hosts": hosts.drop(columns=["peak_rss"]).to_dict("records"),
            "accuracy": float(rounds["mean_accuracy"].iloc[-1]),
            "refusal": refusal,
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpus")
    result = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_gpu_fractions", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("LAYOUT ")]
    return json.loads(line.removeprefix("LAYOUT "))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.cluster
def test_four_client_actors_of_a_quarter_share_the_one_gpu(layout):
    clients = sorted(
        (row for row in layout["hosts"] if row["host"].startswith("clients-")),
        key=lambda row: row["host"],
    )
    assert [row["host"] for row in clients] == ["clients-0", "clients-1", "clients-2", "clients-3"]
    # The head has no GPU: every client actor is on the worker, a quarter of its GPU each.
    assert {row["node"] for row in clients} == {layout["worker"]}
    assert [row["num_gpus"] for row in clients] == [0.25] * 4
    assert [row["num_cpus"] for row in clients] == [0.5] * 4
    (server,) = [row for row in layout["hosts"] if row["host"] == "server"]
    assert server["num_gpus"] == 0.0 and server["num_cpus"] == 0.0  # coordinators take none
    assert server["node"] in (layout["head"], layout["worker"])


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.cluster
def test_device_auto_trains_on_cpu_where_torch_sees_no_gpu(layout):
    clients = [row for row in layout["hosts"] if row["host"].startswith("clients-")]
    assert {row["device"] for row in clients} == {"cpu"}
    assert layout["accuracy"] > 0.1  # it trained: better than chance on 10 digits


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.cluster
def test_device_cuda_where_torch_sees_no_gpu_is_one_line(layout):
    assert layout["refusal"] == (
        "runtime.device: 'cuda' but torch sees no GPU where a client actor runs "
        "(torch.cuda.is_available() is False in a task given 0.25 GPU); give device: auto "
        "(CPU where torch sees none) or device: cpu"
    )


class Probed:
    """An executor whose GPU probe answers `seen` (True, False, or None: not placed)."""

    def __init__(self, seen):
        self.seen = seen

    def torch_sees_gpu(self):
        return self.seen


@pytest.mark.parametrize(
    ("device", "gpus", "seen", "chosen"),
    [
        ("auto", 0.25, True, "cuda"),
        ("auto", 0.25, False, "cpu"),  # GPUs declared, none torch can use
        ("auto", 0.25, None, "cuda"),  # no answer: the actors' placement says why
        ("auto", 0.0, False, "cpu"),  # no GPU asked for: never probed
        ("cpu", 0.25, True, "cpu"),
        ("cuda", 0.25, True, "cuda"),
    ],
)
def test_the_device_follows_what_torch_sees_in_a_gpu_task(make_config, device, gpus, seen, chosen):
    settings = {"runtime.device": device, "runtime.num_gpus_per_actor": gpus}
    cfg = make_config(**{"runtime.executor": "ray", **settings})
    assert client_device(cfg, Probed(seen)) == chosen


def test_cuda_without_a_gpu_share_is_one_line(make_config):
    cfg = make_config(**{"runtime.executor": "ray", "runtime.device": "cuda"})
    with pytest.raises(ConfigError) as refused:
        client_device(cfg, Probed(True))
    assert str(refused.value) == "runtime.device: 'cuda' needs runtime.num_gpus_per_actor > 0"


if __name__ == "__main__":
    print("LAYOUT " + json.dumps(scenario(Path(sys.argv[1]))), flush=True)
