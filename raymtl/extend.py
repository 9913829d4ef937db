"""Everything a plugin author needs, under one public name: `from raymtl.extend import ...`.

A plugin is a module of your own, named in an experiment's `plugins:` list (a module name
or a path to a .py file), that registers what the experiment then names:

    algorithm.name          @register_algorithm on an Algorithm subclass (its Params typed)
    model.name              @register_model on a FedModel subclass
    data.name               @register_dataset(name[, keyed=True]) on fn(root, download, **params)
                            -> Pool (keys=ClientKeys(...) or generated=Generated(...): by client)
    data.partition.kind     @register_partition(name) on fn(class_counts, num_clients, rng)
    topology.kind           @register_topology(name) on fn(num_nodes, seed, *, params)
    data.tasks[].targets    @register_target(name, loss, metrics) on fn(pool) -> Targets

Every registry checks what it is given against its contract and raises a one-line
ValueError when it breaks it; the experiment reports that as `plugins: 'module': ...`.
The training helpers are the ones the built-in algorithms use (docs/EXTENDING.md walks
through two whole algorithms, and its reference table says what each name here is).
"""

from __future__ import annotations

from raymtl.algorithms.aggregate import (
    by_sender,
    combine,
    is_finite,
    server_update,
    weighted_average,
)
from raymtl.algorithms.base import (
    EVERY_CLIENT,
    SERVER,
    Algorithm,
    FederationInfo,
    LocalTrainingParams,
    Message,
    Params,
    Phase,
    State,
    StepContext,
    client_name,
    index_of,
)
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.scaffold import Scaffold
from raymtl.algorithms.training import (
    LocalRun,
    LossHook,
    derive_seed,
    evaluate,
    load_received,
    load_tensors,
    local_sgd,
    model_tensors,
    train_local_model,
)
from raymtl.data import ClientData, Pool, register_dataset, register_partition
from raymtl.data.source_registry import ClientKeys, Generated
from raymtl.flops import add_flops
from raymtl.graph import register_topology
from raymtl.models import FedModel, register_model
from raymtl.tasks import Targets, register_target
from raymtl.tasks.objectives import task_loss
from raymtl.tasks.spec import TaskSpec

__all__ = [
    "EVERY_CLIENT",
    "SERVER",
    "Algorithm",
    "ClientData",
    "ClientKeys",
    "FedAvg",
    "FedModel",
    "Generated",
    "FederationInfo",
    "LocalRun",
    "LocalTrainingParams",
    "LossHook",
    "Message",
    "Params",
    "Phase",
    "Pool",
    "Scaffold",
    "State",
    "StepContext",
    "Targets",
    "TaskSpec",
    "add_flops",
    "by_sender",
    "client_name",
    "combine",
    "derive_seed",
    "evaluate",
    "index_of",
    "is_finite",
    "load_received",
    "load_tensors",
    "local_sgd",
    "model_tensors",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "register_partition",
    "register_target",
    "register_topology",
    "server_update",
    "task_loss",
    "train_local_model",
    "weighted_average",
]
