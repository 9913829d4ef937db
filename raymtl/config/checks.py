"""The experiment's cross-field rules: each raises one line that names the field.

Called by `ExperimentConfig`'s validator (raymtl/config/schema.py), so a bad file fails
before any actor starts: names that exist in their registries (built-in or a plugin's), an
algorithm that runs on the topology and the tasks, peer graphs that connect, LPS counts that
fit. Each takes the `ExperimentConfig` being validated (`cfg`); this module does not import
schema.py, which imports it.
"""

from __future__ import annotations

from pydantic import ValidationError

from raymtl.algorithms.registry import all_algorithms, get_algorithm
from raymtl.config.base import first_error
from raymtl.config.data import partition_has_tasks
from raymtl.data import PARTITIONS, SOURCES
from raymtl.data.source_registry import check_source_params
from raymtl.graph.topology import build_topology
from raymtl.models import MODELS, check_model_params
from raymtl.tasks.registry import TARGETS


def check_names(cfg) -> None:
    """The dataset and the models exist, and take the parameters the file gives them."""
    named = [("data.name", cfg.data.name, SOURCES), ("model.name", cfg.model.name, MODELS)]
    named += [("model", name, MODELS) for name in sorted(cfg.model.names())]
    named += [
        (f"data.tasks.{t}.source", task.source, SOURCES)
        for t, task in enumerate(cfg.data.tasks)
        if task.source
    ]
    if cfg.data.public and cfg.data.public.name:
        named.append(("data.public.name", cfg.data.public.name, SOURCES))
    for field, name, registry in named:
        if name not in registry:
            raise ValueError(registry.unknown(name, field))
    check_source_params(cfg.data.name, cfg.data.params)
    if cfg.model.differ() is not False and cfg.model.params:
        raise ValueError("model.params: only for one model.name (models that differ use defaults)")
    check_model_params(cfg.model.name, cfg.model.params)


def check_algorithm(cfg) -> None:
    """The algorithm exists, its params are valid and it can run on the topology."""
    algorithm = get_algorithm(cfg.algorithm.name)
    try:
        cfg.algorithm.typed_params()
    except ValidationError as error:
        message = first_error(error, prefix="algorithm.params", model=algorithm.Params)
        raise ValueError(message) from None
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


def check_models(cfg) -> None:
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


def declared_tasks_differ(cfg) -> bool:
    """Whether the file gives clients tasks of different kinds (heads, losses, targets)."""
    tasks = cfg.data.tasks
    kinds = {(t.targets, t.outputs) for t in tasks}
    partition = cfg.data.partition
    relabels = "task_classes" in PARTITIONS[partition.kind].params  # a head per task's classes
    if relabels and partition.task_classes:
        sizes = {len(classes) for classes in partition.task_classes}
        return len(kinds) > 1 or len(sizes) > 1
    return len(kinds) > 1


def check_tasks(cfg) -> None:
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
    if algorithm.task_support == "labels" and any(
        TARGETS[task.targets].loss != "cross_entropy" for task in cfg.data.tasks
    ):
        raise ValueError(
            f"data.tasks: {cfg.algorithm.name} trains on class labels only (targets: label)"
        )


def default_topology(shapes: tuple[str, ...]) -> str:
    """The topology an algorithm gets when the file names none."""
    return {"peer": "erdos_renyi"}.get(shapes[0], shapes[0])


def check_topology(cfg) -> None:
    """Peer graphs are built (and so checked: parameters, connectivity); LPS counts fit."""
    if cfg.shape() == "hierarchical" and cfg.topology.num_lps > cfg.data.num_clients:
        raise ValueError(
            f"topology.num_lps: {cfg.topology.num_lps} LPSs for only {cfg.data.num_clients} clients"
        )
    if cfg.shape() == "peer":
        build_topology(cfg.topology.kind, cfg.data.num_clients, cfg.seeds[0], **cfg.topology.params)
