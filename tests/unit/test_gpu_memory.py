"""GPU memory, checked before any actor starts: what each client host keeps on its GPU (its
clients' data, the working models with their step's gradients and momenta, kept weights, the
public set) against its share of the device's memory, refused in one line naming the knobs.
No GPU needed: the executor's probes report a device's memory as a GPU host's would."""

from __future__ import annotations

import math

import pytest

from raymtl.algorithms.registry import get_algorithm
from raymtl.config import ConfigError
from raymtl.models import build_model
from raymtl.runtime.executors.executor import InlineExecutor
from raymtl.runtime.executors.layout import lay_out
from raymtl.runtime.executors.planning import plan_seed
from raymtl.runtime.executors.probes import Probes
from raymtl.runtime.hosts.memory import STEP_COPIES, check_gpu_memory, client_gpu_bytes


class GpuSeen(Probes):
    """What a client host's probe would see: a GPU of `device_bytes`."""

    def __init__(self, device_bytes: int):
        self.device_bytes = device_bytes

    def torch_sees_gpu(self) -> bool:
        return True

    def gpu_memory(self) -> int:
        return self.device_bytes


def gpu_executor(runtime, device_bytes: int) -> InlineExecutor:
    """An inline executor whose client hosts would train on a GPU of `device_bytes`."""
    executor = InlineExecutor(runtime)
    executor.probes = GpuSeen(device_bytes)
    return executor


def federation_of(cfg):
    plan = plan_seed(cfg, 0)
    return plan.federation, plan.shards


def model_bytes(name: str, classes: int = 10) -> int:
    model = build_model(name, (1, 8, 8), classes)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


@pytest.mark.parametrize(("algorithm", "keeps_model"), [("fedavg", False), ("fedu", True)])
def test_a_hosts_gpu_need_is_its_data_models_and_kept_weights(make_config, algorithm, keeps_model):
    cfg = make_config(**{"algorithm.name": algorithm, "model.name": "mlp"})
    federation, shards = federation_of(cfg)
    hosts = {"clients-0": ["client/0", "client/1"], "clients-1": ["client/2"], "server": ["server"]}
    instance = get_algorithm(algorithm)(cfg.algorithm.typed_params(), None)

    def build(name, classes):
        return build_model(name or "mlp", federation.input_shape, classes)

    need = client_gpu_bytes(instance, federation, shards, hosts, build, batch_clients=2)
    assert set(need) == {"clients-0", "clients-1"}  # coordinators keep nothing on a GPU
    samples = sum(len(shards[p].train_idx) + len(shards[p].test_idx) for p in hosts["clients-0"])
    per_sample = 4 * math.prod(federation.input_shape) + 8  # float32 pixels, an int64 label
    mlp = model_bytes("mlp")
    assert need["clients-0"] == {
        "data": samples * per_sample,
        "models": mlp * STEP_COPIES * 2,  # one working model, two batched slots
        "kept": 2 * mlp if keeps_model else 0,
        "public": 0,
    }


def test_a_host_over_its_share_of_the_gpu_is_one_line():
    need = {"clients-0": {"data": 3 * 10**9, "models": 10**9, "kept": 0, "public": 0}}
    check_gpu_memory(need, share=0.5, device_bytes=8 * 10**9)  # 4 GB of 4 GB: fits
    with pytest.raises(ConfigError) as refused:
        check_gpu_memory(need, share=0.25, device_bytes=8 * 10**9)
    assert str(refused.value) == (
        "runtime.num_gpus_per_actor: 0.25 of a 8.00 GB GPU gives each client actor 2.00 GB, "
        "and clients-0 needs 4.00 GB on it (data 3.00 GB, models 1.00 GB; activations come "
        "on top); give fewer clients an actor (runtime.clients_per_actor), a larger "
        "num_gpus_per_actor, a smaller batch_clients, or device: cpu"
    )


def test_planning_refuses_a_layout_over_the_gpus_memory_before_any_host_starts(
    make_config, tmp_path
):
    settings = {"runtime.device": "cuda", "runtime.num_gpus_per_actor": 0.5}
    cfg = make_config(**settings)
    plan = plan_seed(cfg, 0)
    with pytest.raises(ConfigError, match=r"^runtime.num_gpus_per_actor: 0.5 of a 0.00 GB GPU"):
        lay_out(plan, gpu_executor(cfg.runtime, device_bytes=10**6), tmp_path)
    roomy = gpu_executor(cfg.runtime, device_bytes=80 * 10**9)
    specs = lay_out(plan, roomy, tmp_path)  # fits: laid out, nothing started
    assert {spec.device for name, spec in specs.items() if name.startswith("clients")} == {"cuda"}
