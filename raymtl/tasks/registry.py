"""The registry of task targets (`data.tasks[].targets`): what a task learns, with its loss
and the metrics it may report.

    label        the pool's own class labels (relabelled to a task's classes), cross-entropy
    attributes   binary attributes of grey images (targets.py), bce
    landmarks    box and centroid positions of grey images (targets.py), mse

A plugin adds a target computed per sample from a data set's pool (`Samples`):

    @register_target("stroke", loss="mse", metrics=("mse", "mae"))
    def stroke(pool) -> Targets:
        '''One line for `raymtl list`.'''
        return Targets(values, names)

`values` holds one row per sample of the pool: (N, k) floats for bce (0/1) and mse, whose
head then has k outputs; (N,) class ids 0..k-1 for cross_entropy, with k class `names`.
`loss` is cross_entropy | bce | mse and `metrics` a subset of that loss's (default: all).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from raymtl.registry import NAME, Registry
from raymtl.tasks.spec import METRICS_OF_LOSS, Samples


@dataclass(frozen=True)
class Targets:
    """One row of target values per sample of a pool."""

    values: torch.Tensor  # (N, k) float32; (N,) int64 class ids for cross_entropy
    names: tuple[str, ...]  # k names (of the columns, or of the classes)


@dataclass(frozen=True)
class TargetSpec:
    """A registered target (see the module docstring); `build` None: the pool's labels."""

    name: str
    loss: str
    metrics: tuple[str, ...]
    build: Callable[[Samples], Targets] | None
    description: str

    @property
    def from_labels(self) -> bool:
        """The pool's own labels (relabelled per task), not a table computed from the pool."""
        return self.build is None


TARGETS: Registry[TargetSpec] = Registry("data.tasks.targets", lambda spec: spec.build)
TARGETS.add(
    "label",
    TargetSpec(
        "label",
        "cross_entropy",
        METRICS_OF_LOSS["cross_entropy"],
        None,
        "the source's classes (relabelled to a task's classes)",
    ),
)


def register_target(
    name: str,
    loss: str,
    metrics: Iterable[str] | None = None,
    build: Callable[[Samples], Targets] | None = None,
    description: str | None = None,
):
    """Register target `name` computed by `build(pool) -> Targets`; without `build`, a
    decorator for it. Raises a one-line ValueError for a target that breaks the contract.

    Args:
        name: the target, as `data.tasks[].targets` gives it (letters, digits, _ . -).
        loss: the task's loss: cross_entropy, bce or mse.
        metrics: the metrics it reports, some of the loss's; None: all of them.
        build: `build(pool) -> Targets`, one row per sample of the pool; None: the function
            decorated.
        description: the line `raymtl list` shows; None: the first line of the docstring.

    Returns:
        With `build`, `build` itself, registered; without, the decorator that registers the
        function it decorates and returns it unchanged.

    Raises:
        ValueError: one line for a bad name, a loss or metrics not of the loss's, a `build`
            that is not a one-argument function, or a name another target holds.
    """

    def decorator(function: Callable[[Samples], Targets]) -> Callable[[Samples], Targets]:
        TARGETS.add(name, target_spec(name, loss, metrics, function, description))
        return function

    return decorator if build is None else decorator(build)


def target_spec(name, loss, metrics, build, description) -> TargetSpec:
    """The spec of a target, checked against the contract (see the module docstring)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"register_target: {name!r} is not a name (letters, digits, _ . -)")
    where = f"register_target('{name}')"
    if loss not in METRICS_OF_LOSS:
        raise ValueError(f"{where}: loss {loss!r} is not one of {', '.join(METRICS_OF_LOSS)}")
    allowed = METRICS_OF_LOSS[loss]
    metrics = tuple(allowed if metrics is None else metrics)
    wrong = [metric for metric in metrics if metric not in allowed]
    if wrong or not metrics:
        raise ValueError(f"{where}: metrics of loss {loss} are some of {', '.join(allowed)}")
    if not callable(build) or len(_positional(build)) != 1:
        raise ValueError(f"{where}: build must be a function build(pool) -> Targets")
    refusal = TARGETS.clash(name, TargetSpec(name, loss, metrics, build, ""))
    if refusal is not None:
        raise ValueError(refusal)
    text = description or (inspect.getdoc(build) or "").strip()
    return TargetSpec(name, loss, metrics, build, text.splitlines()[0] if text else "")


def get_target(name: str) -> TargetSpec:
    """The spec of target `name` (one-line ValueError otherwise)."""
    if name not in TARGETS:
        raise ValueError(TARGETS.unknown(name))
    return TARGETS[name]


_COMPUTED: dict[tuple[str, int, int], tuple[Samples, Targets]] = {}


def compute_targets(name: str, pool: Samples) -> Targets:
    """Target `name`'s table for `pool`, checked (one-line ValueError), once per pool."""
    spec = get_target(name)
    if spec.from_labels:
        return Targets(pool.y, tuple(pool.class_names))
    key = (name, id(pool.x), id(pool.y))
    cached = _COMPUTED.get(key)
    if cached is not None and cached[0].x is pool.x and cached[0].y is pool.y:
        return cached[1]
    targets = check_targets(spec, pool, spec.build(pool))
    _COMPUTED[key] = (pool, targets)  # keeps the pool: its ids are not reused meanwhile
    return targets


def check_targets(spec: TargetSpec, pool: Samples, built: object) -> Targets:
    """What `spec.build` returned fits its loss (one-line ValueError otherwise)."""
    where = f"targets '{spec.name}'"
    if isinstance(built, torch.Tensor):
        built = Targets(built, ())
    if not isinstance(built, Targets) or not isinstance(built.values, torch.Tensor):
        raise ValueError(f"{where}: build returned a {type(built).__name__}, not Targets")
    values, samples = built.values, len(pool.y)
    if spec.loss == "cross_entropy":
        if values.shape != (samples,) or values.dtype != torch.int64:
            raise ValueError(f"{where}: cross_entropy targets are ({samples},) int64 class ids")
        k = len(built.names) or int(values.max()) + 1
        if int(values.min()) < 0 or int(values.max()) >= k:
            raise ValueError(f"{where}: class ids must lie in 0..{k - 1} (one per name)")
        names = tuple(built.names) or tuple(str(c) for c in range(k))
        return Targets(values, names)
    if values.ndim != 2 or len(values) != samples or values.shape[1] < 1:
        raise ValueError(f"{where}: {spec.loss} targets are ({samples}, k) values, k >= 1")
    values = values.float()
    if not torch.isfinite(values).all():
        raise ValueError(f"{where}: values must be finite")
    if spec.loss == "bce" and not ((values == 0) | (values == 1)).all():
        raise ValueError(f"{where}: bce targets are 0 or 1")
    names = tuple(built.names) or tuple(f"{spec.name}_{j}" for j in range(values.shape[1]))
    if len(names) != values.shape[1]:
        raise ValueError(f"{where}: {len(names)} names for {values.shape[1]} columns")
    return Targets(values, names)


def target_outputs(pool: Samples, name: str, label_classes) -> int:
    """The head size target `name` needs on this pool (label: the task's classes)."""
    if get_target(name).from_labels:
        return len(label_classes) if label_classes else pool.num_classes
    targets = compute_targets(name, pool)
    return len(targets.names) if targets.values.ndim == 1 else int(targets.values.shape[1])


def _positional(function: Callable) -> list[inspect.Parameter]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty]
