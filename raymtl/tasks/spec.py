"""What a task is: its targets, head size, loss, local optimiser and metrics.

A federation's clients each solve one task. Most experiments have a single
classification task (the source's labels, cross-entropy, the algorithm's SGD);
ColNet and FedMuscle federations mix tasks of different kinds, e.g. multi-label
attributes (BCE, AdamW) beside landmark regression (MSE, Adam).

    loss            metrics
    cross_entropy   accuracy
    bce             precision, recall, f1 (micro)
    mse             mse, mae

The targets a task learns (label, attributes, landmarks, a plugin's) and the loss each
brings are registered in tasks/registry.py.

A `TaskSpec` is plain, frozen metadata: it travels inside the `FederationInfo` to
every host, and a client's data carries its own spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

METRICS_OF_LOSS = {
    "cross_entropy": ("accuracy",),
    "bce": ("precision", "recall", "f1"),
    "mse": ("mse", "mae"),
}
# The one figure a task is judged by, and whether larger is better.
PRIMARY_METRIC = {"cross_entropy": ("accuracy", True), "bce": ("f1", True), "mse": ("mse", False)}
OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class OptimizerSpec:
    """A task's local optimiser; its state is fresh every round (as the step's SGD)."""

    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0  # sgd only
    weight_decay: float = 0.0


@dataclass(frozen=True)
class TaskSpec:
    """One task of a federation (see the module docstring).

    `optimizer` None: the algorithm's own local SGD settings (lr, momentum, weight decay).
    `label_classes`: the source classes of a relabelled classification task (None = all).
    """

    name: str = "label"
    targets: str = "label"
    loss: str = "cross_entropy"
    outputs: int = 0
    optimizer: OptimizerSpec | None = None
    metrics: tuple[str, ...] = ("accuracy",)
    label_classes: tuple[int, ...] | None = None

    @property
    def primary_metric(self) -> str:
        return PRIMARY_METRIC[self.loss][0]

    @property
    def higher_is_better(self) -> bool:
        return PRIMARY_METRIC[self.loss][1]

    def kind(self) -> tuple:
        """What makes two tasks incompatible for whole-model averaging.

        Relabelled class subsets of equal size still share one head shape: FedAvg over them
        is the (poor) baseline of the class-pair experiments, so they do not differ here.
        """
        return (self.targets, self.loss, self.outputs)


def label_task(name: str, outputs: int, label_classes=None) -> TaskSpec:
    """The default task: classify the source's labels with cross-entropy."""
    classes = tuple(int(c) for c in label_classes) if label_classes is not None else None
    return TaskSpec(name=name, outputs=int(outputs), label_classes=classes)


def tasks_differ(specs) -> bool:
    """True when the federation's tasks cannot share one whole model."""
    return len({spec.kind() for spec in specs}) > 1


class Samples(Protocol):
    """What a task's targets are computed from: a data set's samples and labels, as the data
    layer's `Pool` holds them (images (N, C, H, W) whose float values over `scale` lie in
    [0, 1], int64 labels)."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...]
    scale: float
