"""What `raymtl list` shows: every registry, with each entry's typed parameters.

Entries registered by a plugin say so ("(plugin my_module)"): load the plugins first
(`raymtl list --plugin MODULE_OR_PATH`).
"""

from __future__ import annotations

import inspect
import typing

from pydantic import BaseModel
from rich.table import Table
from torch.nn.modules.batchnorm import _BatchNorm

from raymtl.algorithms import all_algorithms
from raymtl.api.catalogue_cache import Section, table
from raymtl.config.data import PartitionConfig
from raymtl.data import PARTITIONS, SOURCES
from raymtl.data.source_registry import COMMON_ARGS as SOURCE_ARGS
from raymtl.data.source_registry import is_keyed
from raymtl.graph import STRUCTURED_KINDS, TOPOLOGIES
from raymtl.models import MODELS, build_model, num_params
from raymtl.plugins import plugin_of
from raymtl.tasks import TARGETS
from raymtl.tasks.spec import OPTIMIZERS
from raymtl.toolbox import settings as toolbox

# What the topology kinds without a peer graph give.
STRUCTURED = {
    "star": ("a server and its clients", ""),
    "hierarchical": ("a GPS over num_lps local parameter servers", "num_lps=2"),
    "none": ("no communication (Local)", ""),
    "groups": ("task groups with task leaders, no server (ColNet)", ""),
}
COMMON_PARTITION = (
    "quantity=equal|lognormal|powerlaw, quantity_sigma, quantity_exponent, rotations, "
    "mask_probs, test_fraction=0.2, max_samples_per_client"
)
TASKS_TAKEN = {"same": "one task", "labels": "one label task", "different": "any tasks"}
BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if text and text.strip() else ""


def type_name(annotation: object) -> str:
    """`int`, `float | None`, ...: an annotation as it reads in code."""
    if annotation is inspect.Parameter.empty or annotation is None:
        return ""
    if isinstance(annotation, type):
        return annotation.__name__
    if typing.get_origin(annotation) is typing.Literal:  # mean|median|...
        return "|".join(str(value) for value in typing.get_args(annotation))
    return str(annotation).replace("typing.", "").replace("raymtl.toolbox.settings.", "")


def typed(name: str, annotation: object, default: object) -> str:
    """'name: type=default' ('name: type (required)' without a default)."""
    kind = type_name(annotation)
    head = f"{name}: {kind}" if kind else name
    return f"{head} (required)" if default is inspect.Parameter.empty else f"{head}={default}"


def param_text(model: type[BaseModel]) -> str:
    """'name: type=default (bounds)' for each field of a params model."""
    parts = []
    for name, field in model.model_fields.items():
        bounds = [
            f"{sign}{getattr(rule, attribute)}"
            for rule in field.metadata
            for attribute, sign in BOUNDS
            if getattr(rule, attribute, None) is not None
        ]
        default = inspect.Parameter.empty if field.is_required() else field.default
        text = typed(name, field.annotation, default)
        parts.append(f"{text} ({', '.join(bounds)})" if bounds else text)
    return ", ".join(parts)


def signature_text(function, skip: tuple[str, ...] = (), keyword_only: bool = False) -> str:
    """'name: type=default' for the parameters of a function (its own, past `skip`)."""
    parameters = [
        p
        for p in inspect.signature(function).parameters.values()
        if p.name not in skip
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and (not keyword_only or p.kind is inspect.Parameter.KEYWORD_ONLY)
    ]
    return ", ".join(typed(p.name, p.annotation, p.default) for p in parameters)


def marked(text: str, registered: object) -> str:
    """`text`, with '(plugin X)' when a plugin registered the entry."""
    plugin = plugin_of(getattr(registered, "__module__", "") or "")
    return f"{text} (plugin {plugin})" if plugin else text


def partition_params(spec) -> str:
    """The kind's own parameters: data.partition's fields (their defaults), else params."""
    fields = PartitionConfig.model_fields
    annotations = {p.name: p.annotation for p in inspect.signature(spec.build).parameters.values()}
    parts = []
    for name, default in spec.params.items():
        if name in fields:
            parts.append(f"{name}={fields[name].default}")
        else:
            parts.append("params." + typed(name, annotations.get(name), default))
    return ", ".join(parts)


def algorithm_rows() -> list[tuple[str, str, str]]:
    return [
        (
            name,
            marked(f"{cls.summary} [{'/'.join(cls.shapes)}; {TASKS_TAKEN[cls.task_support]}]", cls),
            param_text(cls.Params),
        )
        for name, cls in all_algorithms().items()
    ]


def source_rows() -> list[tuple[str, str, str]]:
    return [
        (
            name,
            marked(first_line(fn.__doc__) + (" [by client]" if is_keyed(name) else ""), fn),
            signature_text(fn, SOURCE_ARGS),
        )
        for name, fn in SOURCES.items()
    ]


def partition_rows() -> list[tuple[str, str, str]]:
    rows = [
        (name, marked(spec.description, spec.build), partition_params(spec))
        for name, spec in PARTITIONS.items()
    ]
    every = ("(every kind)", "quantity skew, rotation/mask groups, per-client split")
    return [*rows, (*every, COMMON_PARTITION)]


def model_rows() -> list[tuple[str, str, str]]:
    return [
        (
            name,
            marked(f"{cls.description} ({parameter_counts(name)})", cls),
            signature_text(cls.__init__, ("self", "input_shape", "num_classes")),
        )
        for name, cls in MODELS.items()
    ]


def topology_rows() -> list[tuple[str, str, str]]:
    structured = [(kind, *STRUCTURED[kind]) for kind in STRUCTURED_KINDS]
    annotations = {
        name: {p.name: p.annotation for p in inspect.signature(s.build).parameters.values()}
        for name, s in TOPOLOGIES.items()
    }
    graphs = [
        (
            name,
            marked(spec.description, spec.build),
            ", ".join(typed(k, annotations[name].get(k), v) for k, v in spec.params.items()),
        )
        for name, spec in TOPOLOGIES.items()
    ]
    return structured + graphs


def task_rows() -> list[tuple[str, str, str]]:
    """Targets a task can learn, with the loss and metrics they bring."""
    optimizers = f"optimizer: {'/'.join(OPTIMIZERS)} (lr, momentum, weight_decay)"
    return [
        (
            name,
            marked(spec.description, spec.build),
            f"loss {spec.loss}; metrics {', '.join(spec.metrics)}; {optimizers}",
        )
        for name, spec in TARGETS.items()
    ]


# The toolbox's sections (docs/ALGORITHMS.md §9): what each does, and its typed fields.
TOOLBOX_SECTIONS = (
    ("aggregation", "how averaging steps combine models (§9.1)", toolbox.AggregationSettings),
    (
        "server_optimizer",
        "an optimiser on the server's Δ_t (§9.2)",
        toolbox.ServerOptimizerSettings,
    ),
    ("privacy", "client-level DP with an accountant's ε (§9.3)", toolbox.PrivacySettings),
    ("privacy.sample_level", "DP-SGD inside local training (Opacus)", toolbox.SampleLevelSettings),
    ("compression.uplink", "what compresses a client's update (§9.4)", toolbox.UplinkCodec),
    ("attack", "a seeded share of malicious clients (§9.5)", toolbox.AttackSettings),
)


def toolbox_rows() -> list[tuple[str, str, str]]:
    """The toolbox's sections, with the algorithms that take each part of it."""
    algorithms = all_algorithms()
    takers = {
        part: ", ".join(name for name, cls in algorithms.items() if part in cls.toolbox)
        for part in ("aggregation", "server_optimizer", "privacy", "uplink")
    }
    part_of = {"aggregation": "aggregation", "server_optimizer": "server_optimizer"}
    part_of |= {"privacy": "privacy", "compression.uplink": "uplink", "attack": "uplink"}
    rows = []
    for section, description, settings in TOOLBOX_SECTIONS:
        part = part_of.get(section)
        taken = f" — taken by {takers[part]}" if part else ""
        rows.append((section, description + taken, param_text(settings)))
    return rows


def catalogue_rows() -> list[Section]:
    """(title, rows) per registry: algorithms, datasets, partitions, models, topologies,
    targets (what catalogue_cache.py keeps between commands)."""
    return [
        ("algorithms (algorithm.name)", algorithm_rows()),
        ("datasets (data.name)", source_rows()),
        ("partitions (data.partition.kind)", partition_rows()),
        ("models (model.name)", model_rows()),
        ("topologies (topology.kind)", topology_rows()),
        ("task targets (data.tasks[].targets)", task_rows()),
        ("toolbox (top-level sections)", toolbox_rows()),
    ]


def catalogue_tables() -> list[Table]:
    """One table per registry: algorithms, datasets, partitions, models, topologies, targets."""
    return [table(title, rows) for title, rows in catalogue_rows()]


def parameter_counts(name: str) -> str:
    """The model's parameter count with 10 outputs on grey 28x28 and colour 32x32 images,
    and "batch norm" when it has batch-norm layers (what FedBN keeps on the clients): read
    off the models built for the counts, so the mark costs nothing more."""
    counts, batch_norm = [], False
    for shape, label in (((1, 28, 28), "1x28x28"), ((3, 32, 32), "3x32x32")):
        try:
            model = build_model(name, shape, 10)
        except (ValueError, RuntimeError, TypeError):  # a plugin model may refuse a shape
            counts.append(f"- on {label}")
            continue
        counts.append(f"{num_params(model):,} on {label}")
        batch_norm = batch_norm or any(isinstance(m, _BatchNorm) for m in model.modules())
    text = "parameters: " + ", ".join(counts)
    return f"{text}; batch norm" if batch_norm else text
