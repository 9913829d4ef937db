"""Planning a seed's federation: partition the data, build its topology, check that it fits,
and lay its participants out on hosts (their `HostSpec`s).

    plan = plan_seed(cfg, seed)          # once per seed: the `Plan` (typed params validated)
    check_memory(plan)                   # the pre-flight checks only read it
    specs = lay_out(plan, executor, ...) # at every start of the seed's hosts (recoveries too)

The run's pre-flight check (`check_federation`, before Ray starts) plans the first seed and
hands that plan to the seed's federation, which plans every other seed itself. Only metadata
and sample indices are produced here; each client's data is built from (source, indices)
inside the actor that hosts it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from raymtl.algorithms.base import (
    SERVER,
    FederationInfo,
    Params,
    client_name,
    leader_name,
    lps_name,
)
from raymtl.algorithms.registry import build_algorithm, get_algorithm
from raymtl.config import ConfigError, ExperimentConfig
from raymtl.errors import raised, raised_at, source_file
from raymtl.plugins import search_paths
from raymtl.runtime.executors.executor import Executor
from raymtl.runtime.executors.topology import peer_mixing
from raymtl.runtime.hosts.host import HostSpec
from raymtl.tasks.assign import assign_tasks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """A seed's federation as planned, once, before any host starts: what does not depend on
    where the hosts run. The hosts are laid out from it at each start (`lay_out`)."""

    cfg: ExperimentConfig
    seed: int
    params: Params  # algorithm.params validated by the algorithm's typed model, once
    federation: FederationInfo  # sizes, tasks and heads, models, peer graph, LPSs
    pools: dict  # source name -> its decoded pool
    shards: dict  # client participant -> its ClientShard (indices, task)
    public: object = None  # data.domains.PublicShard (data.public), or None


def plan_seed(cfg: ExperimentConfig, seed: int, executor: Executor | None = None) -> Plan:
    """Plan seed `seed` of `cfg`: its params validated, the data partitioned, the
    federation's metadata built (the peer graph on `executor`'s graph service, topology.py;
    here without one) and every model checked on a sample batch (`check_model`).

    Every failure (missing data, a partition the data cannot give, tasks or models that do
    not fit the source or the algorithm) is one ConfigError line, before any actor starts.
    """
    params = cfg.algorithm.typed_params()
    pools, shards, specs, public = partition(cfg, seed)
    federation = build_federation(cfg, seed, executor, pools[cfg.data.name], shards, specs)
    check_model(cfg, federation)
    by_name = {client_name(s.client_id): s for s in shards}
    return Plan(cfg, seed, params, federation, pools, by_name, public)


def partition(cfg: ExperimentConfig, seed: int):
    """The pools by source name, the clients' shards (indices, task of each client), the
    tasks and the public set (data.public; None without one).

    Every failure (missing data, a partition the data cannot give, tasks that do not fit
    the source or the algorithm) is one ConfigError line, before any actor starts.
    """
    from raymtl.data import load_pool
    from raymtl.data.domains import partition_sources

    data = cfg.data

    def load(name):  # data.params are the main dataset's; other domains load with defaults
        params = data.params if name == data.name else {}
        count = data.num_clients if name == data.name else None
        return load_pool(name, data.root, data.download, seed, count, **params)

    try:
        pools, shards, public = partition_sources(data, seed, load)
        shards, specs = assign_tasks(cfg, pools, shards)
    except ValueError as error:  # bad partition for this dataset: a config error
        raise ConfigError(str(error).splitlines()[0]) from None
    check_task_support(cfg, specs)
    check_inputs(cfg, pools[cfg.data.name])
    return pools, shards, specs, public


def check_inputs(cfg: ExperimentConfig, pool) -> None:
    """Samples of a kind (images, feature vectors, token ids) the algorithm, the models or
    the partition's transforms do not read are refused in one line."""
    from raymtl.models import MODELS

    kind, algorithm = pool.inputs, get_algorithm(cfg.algorithm.name)
    where = f"data.name: '{cfg.data.name}' gives {kind}"
    if kind not in algorithm.inputs:
        reason = f": {algorithm.input_refusal}" if algorithm.input_refusal else ""
        raise ConfigError(
            f"algorithm.name: {cfg.algorithm.name} runs on {'/'.join(algorithm.inputs)}, "
            f"not {kind} ({where}){reason}"
        )
    for name in {cfg.model.name, *cfg.model.names()}:
        model = MODELS.lookup(name)
        if kind not in model.inputs:
            raise ConfigError(
                f"model.name: '{name}' reads {'/'.join(model.inputs)}, not {kind} ({where})"
            )
    partition = cfg.data.partition
    if kind == "tokens" and (partition.rotations or partition.mask_probs):
        field = "rotations" if partition.rotations else "mask_probs"
        raise ConfigError(f"data.partition.{field}: rotates or masks images, not tokens ({where})")


def check_federation(cfg: ExperimentConfig) -> Plan:
    """Everything about the first seed's federation that can fail, before Ray starts: its
    plan (the partition, the tasks and models: `plan_seed`), then the memory of the clients'
    own state, read from the plan. Returns the plan, for the seed's federation to start
    from."""
    runtime = cfg.runtime
    if (
        runtime.precision == "bf16-mixed"
        and runtime.device != "cuda"
        and not runtime.num_gpus_per_actor
    ):
        from raymtl.runtime.hosts.compute import BF16_CPU_FLAGS, bf16_emulated

        if bf16_emulated():  # the driver's CPU: the actors' too on one machine
            log.warning(
                "runtime.precision: bf16-mixed on a CPU without bfloat16 units (%s) is "
                "emulated: rounds may take several times fp32's",
                " / ".join(BF16_CPU_FLAGS),
            )
    plan = plan_seed(cfg, cfg.seeds[0])  # the peer graph computed here: no executor yet
    check_memory(plan)
    return plan


def start_checked_run(cfg: ExperimentConfig, run_dir=None):
    """`check_federation`, then a new run folder for `cfg` (storage/run_dirs.py `start_run`):
    a missing dataset or a partition the data cannot give is a one-line ConfigError before
    Ray starts and before an empty run folder is left behind. Returns the run folder (local
    path, and where the run lives), and the first seed's plan."""
    from raymtl.runtime.storage.run_dirs import start_run

    plan = check_federation(cfg)  # partition, tasks and models: what the algorithm can run
    local, store = start_run(cfg, run_dir)
    return local, store, plan


def check_memory(plan: Plan, reported: int | None = None) -> None:
    """Per-client state (Sheaf-FMTL's maps) against runtime.memory_budget (see memory.py).

    Without a budget: a local run is held to this machine's available memory (its local Ray
    runs here); a run joining a cluster (runtime.address) to the memory Ray reports, once
    connected (`reported`): before that it is only printed.
    """
    import os

    from raymtl.models import build_model
    from raymtl.runtime.executors.placement import actors_that_fit, auto_clients_per_actor
    from raymtl.runtime.hosts.memory import available_memory, check_state_memory, parse_bytes

    cfg, federation = plan.cfg, plan.federation
    algorithm = build_algorithm(cfg.algorithm.name, plan.params)
    runtime, n = cfg.runtime, federation.num_clients
    if runtime.memory_budget is not None:
        budget = parse_bytes(runtime.memory_budget)
    elif runtime.address:  # a cluster: what Ray reports once connected (never refused before)
        budget = reported if reported is not None else float("inf")
    else:  # what this machine has now (the local Ray runs on it)
        budget = available_memory()
    try:
        algorithm.check_resources(federation, budget)
    except ValueError as error:
        raise ConfigError(str(error).splitlines()[0]) from None
    per_host = runtime.clients_per_actor
    if per_host == "auto":  # as a local Ray would lay them out (a cluster's: only printed)
        import torch

        here = {"CPU": runtime.num_cpus or os.cpu_count() or 1, "GPU": torch.cuda.device_count()}
        room = actors_that_fit(
            {"here": here}, runtime.num_cpus_per_actor, runtime.num_gpus_per_actor
        )
        per_host = auto_clients_per_actor(n, room)
    hosts = {
        f"clients-{k}": [client_name(i) for i in block]
        for k, block in enumerate(group_blocks(n, per_host))
    }

    def build(name, num_classes):
        params = cfg.model.params if name in (None, cfg.model.name) else {}
        return build_model(name or cfg.model.name, federation.input_shape, num_classes, **params)

    check_state_memory(algorithm, federation, hosts, budget, build)


def check_task_support(cfg: ExperimentConfig, specs) -> None:
    """An algorithm that averages whole models refuses clients with different tasks."""
    from raymtl.tasks.spec import tasks_differ

    if tasks_differ(specs) and get_algorithm(cfg.algorithm.name).task_support != "different":
        kinds = ", ".join(f"{s.name} ({s.targets}, {s.outputs} outputs)" for s in specs)
        raise ConfigError(
            f"algorithm.name: {cfg.algorithm.name} averages whole models and cannot run "
            f"clients with different tasks: {kinds}"
        )


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


def build_federation(
    cfg: ExperimentConfig, seed: int, executor: Executor | None, pool, shards, specs
) -> FederationInfo:
    """The federation's metadata: sizes, tasks and heads, peer graph (on `executor`'s graph
    service, topology.py; here without an executor), LPSs."""
    n = cfg.data.num_clients
    return FederationInfo(
        public_size=cfg.data.public.size if cfg.data.public else 0,
        num_clients=n,
        samples=tuple(len(s.train_idx) for s in shards),
        num_classes=tuple(specs[s.task].outputs for s in shards),
        input_shape=tuple(pool.x.shape[1:]),
        tasks=tuple(s.task for s in shards),
        groups=tuple(s.group for s in shards),
        task_specs=tuple(specs),
        models=client_models(cfg, seed, shards, specs),
        mixing=peer_mixing(executor, cfg.topology.kind, n, seed, cfg.topology.params)
        if cfg.shape() == "peer"
        else None,
        **lps_layout(cfg, seed),
    )


def client_models(cfg: ExperimentConfig, seed: int, shards, specs) -> tuple[str, ...]:
    """The model each client trains (`model.mix` / `by_task` / `clients`, or one for all)."""
    from raymtl.config.checks import models_refused
    from raymtl.models.assign import assign_models

    model = cfg.model
    try:
        models = assign_models(
            len(shards),
            model.name,
            seed=seed,
            mix=model.mix,
            by_task=model.by_task,
            clients=model.clients,
            task_names=tuple(specs[s.task].name for s in shards),
        )
    except ValueError as error:
        raise ConfigError(str(error).splitlines()[0]) from None
    if len(set(models)) > 1 and get_algorithm(cfg.algorithm.name).model_support != "different":
        raise ConfigError(models_refused(cfg.algorithm.name))
    return models


def check_model(cfg: ExperimentConfig, federation: FederationInfo) -> None:
    """Build every model once here, for each number of classes its clients' tasks have, and
    pass one sample batch through it (2 zeros of the federation's input shape, on the CPU,
    without gradients): bad `model.params`, a model that does not fit the input, one that
    raises, or one whose output size is not its task's classes (a head of 2 outputs on 4
    classes fails in round 1's loss, one of 10 trains without a word) is one line naming
    `model.name`, before any actor starts."""
    import torch

    from raymtl.models import MODELS, build_model

    shape = tuple(federation.input_shape)
    kinds = {
        (name, classes, federation.task_specs[task])
        for name, classes, task in zip(
            federation.models, federation.num_classes, federation.tasks, strict=True
        )
    }
    for name, classes, task in sorted(kinds, key=lambda kind: (kind[0], kind[1], kind[2].name)):
        params = cfg.model.params if name == cfg.model.name else {}
        model_cls = MODELS.lookup(name)
        culprit = f"{'model.name' if name == cfg.model.name else 'model'}: '{name}'"
        culprit += f" ({model_cls.__qualname__}, {source_file(model_cls) or '?'})"
        try:
            model = build_model(name, shape, classes, **params)
        except ValueError as error:
            raise ConfigError(str(error).splitlines()[0]) from None
        except Exception as error:  # a user's model may raise anything
            raise ConfigError(
                f"{culprit} raised {raised(error)} ({raised_at(error, model_cls)}) when built "
                f"for input {shape} and {classes} classes"
            ) from error
        sample = torch.zeros(2, *shape)
        try:
            with torch.no_grad():
                output = model.eval()(sample)
        except Exception as error:  # a user's model may raise anything
            raise ConfigError(
                f"{culprit} raised {raised(error)} ({raised_at(error, model_cls)}) on a sample "
                f"batch of 2 zeros of shape {shape}"
            ) from error
        gave = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        if gave != (2, classes):
            size = gave[-1] if isinstance(gave, tuple) and len(gave) == 2 else gave
            kind = "classes" if task.loss == "cross_entropy" else f"outputs ({task.targets})"
            raise ConfigError(
                f"{culprit} outputs {size} values per sample, but task '{task.name}' has "
                f"{classes} {kind}: its head must output num_classes ({classes}) values (a "
                f"sample batch of shape {(2, *shape)} gave {gave})"
            )


def surviving_layout(plan: Plan, executor: Executor, lost) -> dict:
    """host_layout without the participants the run went on without (hosts left empty go)."""
    layout = {
        name: [p for p in members if p not in lost]
        for name, members in host_layout(plan.cfg, plan.federation, executor).items()
    }
    return {name: members for name, members in layout.items() if members}


def host_layout(cfg: ExperimentConfig, federation: FederationInfo, executor: Executor) -> dict:
    """Host name -> the participants it keeps resident (clients pinned in blocks)."""
    n = federation.num_clients
    layout = {
        f"clients-{k}": [client_name(i) for i in block]
        for k, block in enumerate(group_blocks(n, executor.placement.clients_per_actor(n)))
    }
    if cfg.shape() in ("star", "hierarchical"):
        layout["server"] = [SERVER]
    algorithm = get_algorithm(cfg.algorithm.name)
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
    cfg, federation = plan.cfg, plan.federation
    algorithm = build_algorithm(cfg.algorithm.name, plan.params)

    def build(name, num_classes):
        params = cfg.model.params if name in (None, cfg.model.name) else {}
        return build_model(name or cfg.model.name, federation.input_shape, num_classes, **params)

    shards, batch_clients = plan.shards, cfg.runtime.batch_clients
    need = client_gpu_bytes(algorithm, federation, shards, layout, build, batch_clients)
    check_gpu_memory(need, cfg.runtime.num_gpus_per_actor, device_bytes)


def group_blocks(num_clients: int, per_host: int) -> list[list[int]]:
    """Clients pinned to hosts in contiguous blocks."""
    return [list(range(s, min(s + per_host, num_clients))) for s in range(0, num_clients, per_host)]


def lps_layout(cfg: ExperimentConfig, seed: int) -> dict:
    """Hierarchical FL: users assigned to LPSs at random (seeded)."""
    if cfg.shape() != "hierarchical":
        return {}
    from raymtl.graph.assignment import random_assignment

    lps_of_client = random_assignment(cfg.data.num_clients, cfg.topology.num_lps, seed)
    return {"lps_of_client": lps_of_client, "num_lps": cfg.topology.num_lps}
