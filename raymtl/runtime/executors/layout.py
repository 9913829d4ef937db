"""Laying a planned seed out on an executor's hosts: which participants each host keeps
resident, the device its clients train on, and each host's `HostSpec`.

    specs = lay_out(plan, executor, seed_dir)   # at every start of the seed's hosts

It runs at each start of a seed's hosts, recoveries too: the room the executor has (and so the
layout) may have changed since the seed was planned (`planning.plan_seed`, once per seed).
"""

from __future__ import annotations

from raymtl.algorithms.base import SERVER, leader_name, lps_name
from raymtl.config import ConfigError, ExperimentConfig
from raymtl.plugins import search_paths
from raymtl.runtime.executors.executor import Executor
from raymtl.runtime.executors.placement import client_blocks
from raymtl.runtime.executors.planning import Plan, check_memory
from raymtl.runtime.hosts.host import HostSpec


def lay_out(
    plan: Plan,
    executor: Executor,
    seed_dir,
    resume_round: int = 0,
    lost: list[str] = (),
) -> dict[str, HostSpec]:
    """The hosts' specs for `plan` on `executor`'s hosts, less the participants the run went
    on without (`lost`): the layout (clients per actor on the room the executor has), the
    device the clients train on, and the pools shared where the executor shares them."""
    cfg, federation = plan.cfg, plan.federation
    if cfg.runtime.address and cfg.runtime.memory_budget is None:
        check_memory(plan, executor.probes.memory_available())
    # Both before the pools travel, so a refusal is cheap; the layout first, as a layout
    # that cannot fit is refused from the cluster's size alone, and the device probe
    # starts a task on a GPU share.
    layout = surviving_layout(plan, executor, lost)
    device = client_device(cfg, executor.probes)
    if device == "cuda":
        check_gpu_fits(plan, layout, executor.probes)
    # Once per start in Ray's object store (None in process: each host loads its own).
    shared = executor.placement.share_pools(plan.pools)
    from raymtl.data.shards import ShardTable  # the clients' shards as columns (pickled fast)

    by_name = plan.shards
    return {
        name: HostSpec(
            config=cfg,
            federation=federation,
            participants=tuple(members),
            shards=ShardTable([by_name[p] for p in members if p in by_name]),
            public=plan.public if any(p in by_name for p in members) else None,
            pools=shared if any(p in by_name for p in members) else None,
            seed=plan.seed,
            torch_threads=max(1, int(cfg.runtime.num_cpus_per_actor)),
            device=device if members[0].startswith("client") else "cpu",
            checkpoint_root=str(seed_dir),  # a path or a URI (runtime/storage/location.py)
            resume_round=resume_round,
            plugin_paths=search_paths(),
            name=name,
        )
        for name, members in layout.items()
    }


def surviving_layout(plan: Plan, executor: Executor, lost) -> dict:
    """host_layout without the participants the run went on without (hosts left empty go)."""
    layout = {
        name: [p for p in members if p not in lost]
        for name, members in host_layout(plan, executor).items()
    }
    return {name: members for name, members in layout.items() if members}


def host_layout(plan: Plan, executor: Executor) -> dict:
    """Host name -> the participants it keeps resident (clients pinned in blocks)."""
    cfg, federation, algorithm = plan.cfg, plan.federation, plan.algorithm
    n = federation.num_clients
    layout = client_blocks(n, executor.placement.clients_per_actor(n))
    if cfg.shape() in ("star", "hierarchical"):
        layout["server"] = [SERVER]
    if algorithm.uses_graph:
        layout["graph"] = ["graph"]
    if algorithm.uses_leaders:  # one light leader host per task group
        for group in federation.task_groups():
            layout[f"leader-{group}"] = [leader_name(group)]
    for k in range(federation.num_lps):
        layout[f"lps-{k}"] = [lps_name(k)]
    return layout


def client_device(cfg: ExperimentConfig, probes) -> str:
    """Client hosts train on a GPU when the actors ask for one and torch sees it there.

    Under Ray the GPU is the actor's (Ray sets its CUDA_VISIBLE_DEVICES), not the driver's:
    the executor's `probes` ask a task holding an actor's GPU share (`torch_sees_gpu`,
    probes.py). A cluster that declares GPUs torch cannot use (`num_gpus` as a plain
    resource count) trains on CPU under `device: auto`, and refuses `device: cuda` in one
    line, before any actor starts: never a traceback inside an actor."""
    runtime = cfg.runtime
    if runtime.device == "cuda" and runtime.num_gpus_per_actor == 0:
        raise ConfigError("runtime.device: 'cuda' needs runtime.num_gpus_per_actor > 0")
    wants_gpu = runtime.device == "cuda" or (
        runtime.device == "auto" and runtime.num_gpus_per_actor > 0
    )
    if not wants_gpu:
        return "cpu"
    seen = probes.torch_sees_gpu()  # None: not known
    if seen is False and runtime.device == "cuda":
        share = f"{runtime.num_gpus_per_actor:g}"
        raise ConfigError(
            f"runtime.device: 'cuda' but torch sees no GPU where a client actor runs "
            f"(torch.cuda.is_available() is False in a task given {share} GPU); give "
            "device: auto (CPU where torch sees none) or device: cpu"
        )
    return "cpu" if seen is False else "cuda"


def check_gpu_fits(plan: Plan, layout: dict, probes) -> None:
    """Client hosts on a GPU: what each keeps there against its share of the device's memory
    (memory.client_gpu_bytes), refused in one line before any actor starts. Skipped where the
    device's memory is not known (no task holding a GPU share was placed)."""
    from raymtl.models import build_model
    from raymtl.runtime.hosts.memory import check_gpu_memory, client_gpu_bytes

    device_bytes = probes.gpu_memory()
    if not device_bytes:
        return
    cfg, federation, algorithm = plan.cfg, plan.federation, plan.algorithm

    def build(name, num_classes):
        params = cfg.model.params if name in (None, cfg.model.name) else {}
        return build_model(name or cfg.model.name, federation.input_shape, num_classes, **params)

    shards, batch_clients = plan.shards, cfg.runtime.batch_clients
    need = client_gpu_bytes(algorithm, federation, shards, layout, build, batch_clients)
    check_gpu_memory(need, cfg.runtime.num_gpus_per_actor, device_bytes)
