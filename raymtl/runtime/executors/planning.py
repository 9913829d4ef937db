"""Planning a seed's federation, once per seed: partition the data, build its topology and
check that it fits, before any host starts.

    plan = plan_seed(cfg, seed)          # once per seed: the `Plan` (typed params validated)
    check_memory(plan)                   # the pre-flight checks only read it

The hosts are laid out from the plan at each start (layout.py `lay_out`). The run's pre-flight
check (`check_federation`, before Ray starts) plans the first seed and hands that plan to the
seed's federation, which plans every other seed itself. Only metadata and sample indices are
produced here; each client's data is built from (source, indices) inside the actor that hosts
it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from raymtl.algorithms.base import Algorithm, FederationInfo, Params, client_name
from raymtl.algorithms.registry import build_algorithm
from raymtl.config import ConfigError, ExperimentConfig
from raymtl.errors import raised, raised_at, source_file
from raymtl.runtime.executors.executor import Executor
from raymtl.runtime.executors.placement import client_blocks, clients_per_actor_here
from raymtl.runtime.executors.topology import peer_mixing
from raymtl.tasks.assign import assign_tasks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """A seed's federation as planned, once, before any host starts: what does not depend on
    where the hosts run. The hosts are laid out from it at each start (layout.py `lay_out`)."""

    cfg: ExperimentConfig
    seed: int
    params: Params  # algorithm.params validated by the algorithm's typed model, once
    # Built once from `params`, without models: what the checks and the round loop ask of
    # it (its phases, what it supports, its state's size). Each host builds its own.
    algorithm: Algorithm
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
    algorithm = build_algorithm(cfg.algorithm.name, params)
    pools, shards, specs, public = partition(cfg, seed)
    pool = pools[cfg.data.name]
    check_support(cfg, algorithm, pool, specs)
    federation = build_federation(cfg, seed, executor, algorithm, pool, shards, specs)
    check_model(cfg, federation)
    by_name = {client_name(s.client_id): s for s in shards}
    return Plan(cfg, seed, params, algorithm, federation, pools, by_name, public)


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
    return pools, shards, specs, public


def check_support(cfg: ExperimentConfig, algorithm: Algorithm, pool, specs) -> None:
    """What the algorithm and the models read, against the data and its tasks, each refused
    in one line: clients with different tasks under an algorithm that averages whole
    models; samples of a kind (images, feature vectors, token ids) the algorithm, the models
    or the partition's transforms do not read."""
    from raymtl.models import MODELS
    from raymtl.tasks.spec import tasks_differ

    if tasks_differ(specs) and algorithm.task_support != "different":
        kinds = ", ".join(f"{s.name} ({s.targets}, {s.outputs} outputs)" for s in specs)
        raise ConfigError(
            f"algorithm.name: {cfg.algorithm.name} averages whole models and cannot run "
            f"clients with different tasks: {kinds}"
        )
    kind = pool.inputs
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
    from raymtl.models import build_model
    from raymtl.runtime.hosts.memory import available_memory, check_state_memory

    cfg, federation, algorithm = plan.cfg, plan.federation, plan.algorithm
    runtime, n = cfg.runtime, federation.num_clients
    if runtime.memory_budget is not None:
        budget = runtime.memory_budget_bytes
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
        per_host = clients_per_actor_here(n, runtime)
    hosts = client_blocks(n, per_host)

    def build(name, num_classes):
        params = cfg.model.params if name in (None, cfg.model.name) else {}
        return build_model(name or cfg.model.name, federation.input_shape, num_classes, **params)

    check_state_memory(algorithm, federation, hosts, budget, build)


def build_federation(
    cfg: ExperimentConfig,
    seed: int,
    executor: Executor | None,
    algorithm: Algorithm,
    pool,
    shards,
    specs,
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
        models=client_models(cfg, seed, algorithm, shards, specs),
        mixing=peer_mixing(executor, cfg.topology.kind, n, seed, cfg.topology.params)
        if cfg.shape() == "peer"
        else None,
        **lps_layout(cfg, seed),
    )


def client_models(
    cfg: ExperimentConfig, seed: int, algorithm: Algorithm, shards, specs
) -> tuple[str, ...]:
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
    if len(set(models)) > 1 and algorithm.model_support != "different":
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


def lps_layout(cfg: ExperimentConfig, seed: int) -> dict:
    """Hierarchical FL: users assigned to LPSs at random (seeded)."""
    if cfg.shape() != "hierarchical":
        return {}
    from raymtl.graph.assignment import random_assignment

    lps_of_client = random_assignment(cfg.data.num_clients, cfg.topology.num_lps, seed)
    return {"lps_of_client": lps_of_client, "num_lps": cfg.topology.num_lps}
