"""What `raymtl list` shows: every registry, with each entry's parameters."""

from __future__ import annotations

import inspect

from pydantic import BaseModel
from rich.markup import escape
from rich.table import Table


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""


def param_text(model: type[BaseModel]) -> str:
    """'name=default' for each field of a params model."""
    return ", ".join(f"{name}={field.default}" for name, field in model.model_fields.items())


def signature_params(function) -> str:
    """'name=default' for each keyword parameter of a loader."""
    parameters = inspect.signature(function).parameters.values()
    return ", ".join(
        f"{p.name}={p.default}"
        for p in parameters
        if p.default is not inspect.Parameter.empty and p.name not in ("root", "download", "seed")
    )


COMMON_PARTITION = (
    "quantity=equal|lognormal|powerlaw, quantity_sigma, quantity_exponent, rotations, "
    "mask_probs, test_fraction=0.2, max_samples_per_client"
)


def partition_params(function) -> str:
    """The keyword-only fields a partition kind reads, with PartitionConfig's defaults."""
    from raymtl.config import PartitionConfig

    fields = PartitionConfig.model_fields
    names = [
        p.name
        for p in inspect.signature(function).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name in fields
    ]
    return ", ".join(f"{name}={fields[name].default}" for name in names)


def table(title: str, rows: list[tuple[str, str, str]]) -> Table:
    result = Table(title=title, title_justify="left", show_lines=False)
    for column in ("name", "what", "parameters"):
        result.add_column(column, overflow="fold")
    for row in rows:
        result.add_row(*(escape(cell) for cell in row))  # "[i, j]" is text, not markup
    return result


def catalogue_tables() -> list[Table]:
    """One table per registry: algorithms, datasets, partitions, models, topologies."""
    from raymtl.algorithms import all_algorithms
    from raymtl.data import PARTITIONS, SOURCES
    from raymtl.graph import TOPOLOGIES
    from raymtl.models import MODELS

    tasks_taken = {"same": "one task", "labels": "one label task", "different": "any tasks"}
    algorithms = [
        (
            name,
            f"{cls.summary} [{'/'.join(cls.shapes)}; {tasks_taken[cls.task_support]}]",
            param_text(cls.Params),
        )
        for name, cls in all_algorithms().items()
    ]
    sources = [(name, first_line(fn.__doc__), signature_params(fn)) for name, fn in SOURCES.items()]
    partitions = [
        (name, first_line(getattr(fn, "__doc__", str(fn))), partition_params(fn))
        for name, fn in PARTITIONS.items()
    ] + [
        ("(every kind)", "quantity skew, rotation/mask groups, per-client split", COMMON_PARTITION)
    ]
    models = [
        (
            name,
            f"{cls.description} ({parameter_counts(name)})",
            ", ".join(f"{k}={v}" for k, v in cls.params.items()),
        )
        for name, cls in MODELS.items()
    ]
    topologies = [
        ("star", "a server and its clients", ""),
        ("hierarchical", "a GPS over num_lps local parameter servers", "num_lps=2"),
        ("none", "no communication (Local)", ""),
        ("groups", "task groups with task leaders, no server (ColNet)", ""),
    ] + [
        (name, spec.description, ", ".join(f"{k}={v}" for k, v in spec.params.items()))
        for name, spec in TOPOLOGIES.items()
    ]
    return [
        table("algorithms", algorithms),
        table("datasets (data.name)", sources),
        table("partitions (data.partition.kind)", partitions),
        table("models (model.name)", models),
        table("topologies (topology.kind)", topologies),
        table("task targets (data.tasks[].targets)", task_rows()),
    ]


def parameter_counts(name: str) -> str:
    """The model's parameter count with 10 outputs on grey 28x28 and colour 32x32 images."""
    from raymtl.models import build_model, num_params

    counts = []
    for shape, label in (((1, 28, 28), "1x28x28"), ((3, 32, 32), "3x32x32")):
        try:
            counts.append(f"{num_params(build_model(name, shape, 10)):,} on {label}")
        except ValueError:
            counts.append(f"- on {label}")
    return "parameters: " + ", ".join(counts)


def task_rows() -> list[tuple[str, str, str]]:
    """Targets a task can learn, with the loss and metrics they bring."""
    from raymtl.tasks.spec import LOSS_OF_TARGETS, METRICS_OF_LOSS, OPTIMIZERS

    what = {
        "label": "the source's classes (relabelled to a task's classes)",
        "attributes": "binary attributes of grey images (tasks/targets.py), multi-label",
        "landmarks": "bounding box and intensity centroid of grey images, regression",
    }
    optimizers = f"optimizer: {'/'.join(OPTIMIZERS)} (lr, momentum, weight_decay)"
    return [
        (
            target,
            what[target],
            f"loss {loss}; metrics {', '.join(METRICS_OF_LOSS[loss])}; {optimizers}",
        )  # fmt: skip
        for target, loss in LOSS_OF_TARGETS.items()
    ]
