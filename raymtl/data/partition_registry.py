"""The registry of partition kinds (`data.partition.kind`).

Most kinds say only how much each client wants of each class, and partitions.py does the
rest (quantity skew, the per-client train/test split, caps, rotation groups):

    @register_partition("two_level")
    def two_level(class_counts, num_clients, rng, *, high: float = 0.8) -> np.ndarray:
        '''One line for `raymtl list`.'''
        return affinity  # (num_classes, num_clients), >= 0

Each class's samples are split among the clients in proportion to affinity x quantity
weight. A 0/1 affinity is membership (a client given a class gets at least one sample of
it); other values are shares, and clients left with fewer than a handful of samples are
topped up from the largest (as Dirichlet skew is). The keyword-only parameters are the
kind's own: the fields of `data.partition` of the same name (classes_per_client, alpha,
task_classes), else `data.partition.params`.

`shards=True`: the function builds the clients' shards itself, `fn(labels, num_classes,
**options) -> list[ClientShard]` with every option of `partition_clients`.
`keyed=True`: the kind reads the clients the data itself holds, `fn(pool, num_clients,
**options) -> list[ClientShard]` (natural.py).
`assigns_tasks=True`: the kind gives each client a task (the config then maps `data.tasks`
onto them). `holds_every_class=True`: each client must hold a sample of every class its
affinity marks, else the partition is refused.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from raymtl.registry import NAME, Registry

# The positional arguments of an affinity function, in order.
AFFINITY_ARGS = ("class_counts", "num_clients", "rng")


@dataclass(frozen=True)
class PartitionSpec:
    """A registered partition kind (see the module docstring)."""

    build: Callable
    description: str
    params: dict[str, object]  # keyword-only parameter -> default (inspect's empty: none)
    shards: bool = False
    assigns_tasks: bool = False
    holds_every_class: bool = False
    keyed: bool = False


REQUIRED = inspect.Parameter.empty
PARTITIONS: Registry[PartitionSpec] = Registry("data.partition.kind", lambda spec: spec.build)


def register_partition(
    name: str,
    *,
    shards: bool = False,
    assigns_tasks: bool = False,
    holds_every_class=False,
    keyed: bool = False,
) -> Callable[[Callable], Callable]:
    """Decorator: register a partition kind under `name` (see the module docstring).

    Raises a one-line ValueError for a function that breaks the contract or a taken name.

    Args:
        name: the kind, as `data.partition.kind` gives it (letters, digits, _ . -).
        shards: the function builds the clients' shards itself,
            `fn(labels, num_classes, **options) -> list[ClientShard]`, rather than returning
            an affinity `fn(class_counts, num_clients, rng, *, params)`.
        assigns_tasks: the kind gives each client a task (`data.tasks` is mapped onto them).
        holds_every_class: each client must hold a sample of every class its affinity
            marks, else the partition is refused.
        keyed: the kind reads the clients the data itself holds,
            `fn(pool, num_clients, **options) -> list[ClientShard]` (natural.py).

    Returns:
        The decorator: it registers the function and returns it unchanged.

    Raises:
        ValueError: one line, from the decorator, for a bad name, a function of the wrong
            signature or without a docstring (`raymtl list` shows its first line), or a
            name another kind holds.
    """

    def decorator(build: Callable) -> Callable:
        spec = partition_spec(name, build, shards or keyed, assigns_tasks, holds_every_class)
        PARTITIONS.add(name, dataclasses.replace(spec, keyed=keyed))
        return build

    return decorator


def partition_spec(name, build, shards, assigns_tasks, holds_every_class) -> PartitionSpec:
    """The spec of `build` as kind `name`, checked against the contract."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"register_partition: {name!r} is not a name (letters, digits, _ . -)")
    where = f"register_partition('{name}')"
    if not callable(build):
        raise ValueError(f"{where}: {build!r} is not a function")
    refusal = PARTITIONS.clash(name, PartitionSpec(build, "", {}))
    if refusal is not None:
        raise ValueError(refusal)
    parameters = list(inspect.signature(build).parameters.values())
    if not shards:
        positional = [p for p in parameters if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        if len(positional) != len(AFFINITY_ARGS):
            raise ValueError(
                f"{where}: {build.__qualname__} must take (class_counts, num_clients, rng, *, "
                "params) and return a (classes, clients) affinity"
            )
    params = {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    description = (inspect.getdoc(build) or "").strip()
    if not description:
        raise ValueError(f"{where}: {build.__qualname__} needs a docstring (for `raymtl list`)")
    first = description.splitlines()[0]
    return PartitionSpec(build, first, params, shards, assigns_tasks, holds_every_class)


def get_partition(kind: str) -> PartitionSpec:
    """The spec of partition `kind` (one-line ValueError otherwise)."""
    if kind not in PARTITIONS:
        raise ValueError(PARTITIONS.unknown(kind))
    return PARTITIONS[kind]
