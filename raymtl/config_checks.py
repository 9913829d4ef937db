"""The experiment's cross-field rules: each raises one line that names the field.

Called by `ExperimentConfig`'s validator (raymtl/config.py), so a bad file fails before any
actor starts: names that exist, an algorithm that runs on the topology and the tasks, peer
graphs that connect, LPS counts that fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from raymtl.algorithms.registry import all_algorithms, get_algorithm

if TYPE_CHECKING:
    from raymtl.config import ExperimentConfig, PartitionConfig


def partition_has_tasks(partition: PartitionConfig) -> bool:
    """Partitions that assign each client a task themselves."""
    return partition.kind in ("task_groups", "fmnist_tasks", "cifar10_tasks")


def check_names(cfg: ExperimentConfig) -> None:
    """The dataset and the model exist (their parameters are checked when built)."""
    from raymtl.data import SOURCES
    from raymtl.models import MODELS

    named = [("data.name", cfg.data.name, SOURCES), ("model.name", cfg.model.name, MODELS)]
    named += [("model", name, MODELS) for name in sorted(cfg.model.names())]
    named += [(f"data.tasks.{t}.source", task.source, SOURCES)
              for t, task in enumerate(cfg.data.tasks) if task.source]  # fmt: skip
    if cfg.data.public and cfg.data.public.name:
        named.append(("data.public.name", cfg.data.public.name, SOURCES))
    for field, name, registry in named:
        if name not in registry:
            raise ValueError(f"{field}: '{name}' is not one of {', '.join(sorted(registry))}")
    if cfg.model.differ() is not False and cfg.model.params:
        raise ValueError("model.params: only for one model.name (models that differ use defaults)")


def check_algorithm(cfg: ExperimentConfig) -> None:
    """The algorithm exists, its params are valid and it can run on the topology."""
    algorithm = get_algorithm(cfg.algorithm.name)
    try:
        cfg.algorithm.typed_params()
    except ValidationError as error:
        raise ValueError(first_error(error, prefix="algorithm.params")) from None
    if cfg.topology.kind is None:
        cfg.topology.kind = default_topology(algorithm.shapes)
    if algorithm.uses_public and cfg.data.public is None:
        raise ValueError(
            f"data.public: {cfg.algorithm.name} aligns clients on a public dataset; add "
            "data.public: {size: 1000} (name: a dataset; default data.name's test split)"
        )
    if cfg.shape() not in algorithm.shapes:
        raise ValueError(
            f"topology.kind: {cfg.algorithm.name} runs on {'/'.join(algorithm.shapes)}, "
            f"not '{cfg.topology.kind}'"
        )


def check_models(cfg: ExperimentConfig) -> None:
    """An algorithm that needs one architecture refuses clients whose models differ."""
    algorithm = get_algorithm(cfg.algorithm.name)
    if cfg.model.differ() and algorithm.model_support != "different":
        raise ValueError(models_refused(cfg.algorithm.name))


def models_refused(name: str) -> str:
    """The one line that refuses different models for algorithm `name`."""
    accepting = [n for n, a in all_algorithms().items() if a.model_support == "different"]
    return (
        f"algorithm.name: {name} needs every client to train the same model architecture "
        f"(model.mix / by_task / clients); use {', '.join(accepting)}"
    )


def declared_tasks_differ(cfg: ExperimentConfig) -> bool:
    """Whether the file gives clients tasks of different kinds (heads, losses, targets)."""
    tasks = cfg.data.tasks
    kinds = {(t.targets, t.outputs) for t in tasks}
    if cfg.data.partition.kind == "task_groups" and cfg.data.partition.task_classes:
        sizes = {len(classes) for classes in cfg.data.partition.task_classes}
        return len(kinds) > 1 or len(sizes) > 1
    return len(kinds) > 1


def check_tasks(cfg: ExperimentConfig) -> None:
    """Tasks fit the partition, and the algorithm can run a federation of different tasks."""
    partition = cfg.data.partition
    dealt_by_file = any(task.clients is not None for task in cfg.data.tasks)
    if partition_has_tasks(partition) and len(cfg.data.tasks) > 1 and dealt_by_file:
        raise ValueError(
            f"data.tasks: partition '{partition.kind}' assigns the clients; drop 'clients'"
        )
    algorithm = get_algorithm(cfg.algorithm.name)
    if declared_tasks_differ(cfg) and algorithm.task_support != "different":
        accepting = [n for n, a in all_algorithms().items() if a.task_support == "different"]
        raise ValueError(
            f"algorithm.name: {cfg.algorithm.name} averages whole models and cannot run clients "
            f"with different tasks (data.tasks); use {', '.join(accepting)}"
        )
    if algorithm.task_support == "labels" and any(t.targets != "label" for t in cfg.data.tasks):
        raise ValueError(
            f"data.tasks: {cfg.algorithm.name} trains on class labels only (targets: label)"
        )


def default_topology(shapes: tuple[str, ...]) -> str:
    """The topology an algorithm gets when the file names none."""
    return {"peer": "erdos_renyi"}.get(shapes[0], shapes[0])


def check_topology(cfg: ExperimentConfig) -> None:
    """Peer graphs are built (and so checked: parameters, connectivity); LPS counts fit."""
    if cfg.shape() == "hierarchical" and cfg.topology.num_lps > cfg.data.num_clients:
        raise ValueError(
            f"topology.num_lps: {cfg.topology.num_lps} LPSs for only {cfg.data.num_clients} clients"
        )
    if cfg.shape() == "peer":
        from raymtl.graph.topology import build_topology

        build_topology(cfg.topology.kind, cfg.data.num_clients, cfg.seeds[0], **cfg.topology.params)


def first_error(error: ValidationError, prefix: str = "") -> str:
    """One line from a pydantic error: 'field.path: message'."""
    detail = error.errors()[0]
    location = ".".join(str(part) for part in detail["loc"])
    location = ".".join(part for part in (prefix, location) if part)
    message = detail["msg"].removeprefix("Value error, ")
    if detail["type"] == "extra_forbidden":
        message = "unknown key"
    return f"{location}: {message}" if location else message
