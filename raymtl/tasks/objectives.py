"""A task's loss, local optimiser and evaluation metrics, as plain torch.

    cross_entropy  CE(logits, y)                       accuracy = mean[argmax = y]
    bce            mean BCE(σ(logits), y) per entry    micro P = TP/(TP+FP), R = TP/(TP+FN),
                                                       F1 = 2PR/(P+R); ŷ = [σ(logit) > 0.5]
    mse            mean (out − y)² per entry           mse, mae = mean |out − y| per entry

Micro averaging counts TP/FP/FN over every (sample, attribute) pair, as scikit-learn's
`precision_recall_fscore_support(average="micro")`; an empty denominator gives 0.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from raymtl.tasks.spec import OptimizerSpec, TaskSpec

LOSSES = {
    "cross_entropy": F.cross_entropy,
    "bce": F.binary_cross_entropy_with_logits,
    "mse": F.mse_loss,
}


def task_loss(task: TaskSpec | None, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean loss of `task` (None: cross-entropy on labels)."""
    return LOSSES["cross_entropy" if task is None else task.loss](outputs, targets)


def build_optimizer(
    parameters: Iterable[nn.Parameter], task: TaskSpec | None, fallback: OptimizerSpec
) -> torch.optim.Optimizer:
    """The task's optimiser, or `fallback` (the algorithm's SGD) when the task names none."""
    spec = task.optimizer if task is not None and task.optimizer is not None else fallback
    if spec.name == "sgd":
        return torch.optim.SGD(
            parameters, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    optimizer_cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.name]
    return optimizer_cls(parameters, lr=spec.lr, weight_decay=spec.weight_decay)


class MetricAccumulator:
    """Sums over evaluation batches; `result()` gives the task's loss and metrics."""

    def __init__(self, task: TaskSpec | None):
        self.loss_kind = "cross_entropy" if task is None else task.loss
        self.samples, self.entries, self.loss_sum = 0, 0, 0.0
        self.sums = {"correct": 0.0, "tp": 0.0, "fp": 0.0, "fn": 0.0, "abs": 0.0, "sq": 0.0}

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        loss = LOSSES[self.loss_kind](outputs, targets, reduction="sum")
        self.loss_sum += float(loss)
        self.samples += len(targets)
        self.entries += targets.numel()
        if self.loss_kind == "cross_entropy":
            self.sums["correct"] += float((outputs.argmax(1) == targets).sum())
        elif self.loss_kind == "bce":
            predicted, actual = outputs > 0, targets > 0.5  # σ(logit) > 0.5 ⇔ logit > 0
            self.sums["tp"] += float((predicted & actual).sum())
            self.sums["fp"] += float((predicted & ~actual).sum())
            self.sums["fn"] += float((~predicted & actual).sum())
        else:
            error = outputs - targets
            self.sums["abs"] += float(error.abs().sum())
            self.sums["sq"] += float((error**2).sum())

    def result(self) -> dict[str, float]:
        if self.loss_kind == "cross_entropy":  # CE is summed per sample, the others per entry
            n = max(self.samples, 1)
            return {"loss": self.loss_sum / n, "accuracy": self.sums["correct"] / n}
        n = max(self.entries, 1)
        if self.loss_kind == "bce":
            counts = micro_prf(self.sums["tp"], self.sums["fp"], self.sums["fn"])
            return {"loss": self.loss_sum / n, **counts}
        return {"loss": self.loss_sum / n, "mse": self.sums["sq"] / n, "mae": self.sums["abs"] / n}


def micro_prf(tp: float, fp: float, fn: float) -> dict[str, float]:
    """Micro precision, recall and F1 from summed counts (0 where undefined)."""
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


@torch.no_grad()
def evaluate_task(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: TaskSpec | None, batch: int = 512
) -> dict[str, float]:
    """Mean loss and the task's metrics of `model` on (x, y)."""
    model.eval()
    metrics = MetricAccumulator(task)
    for start in range(0, len(y), batch):
        metrics.add(model(x[start : start + batch]), y[start : start + batch])
    return metrics.result()


@torch.no_grad()
def evaluate_together(
    model: nn.Module,
    tests: list[tuple[torch.Tensor, torch.Tensor, TaskSpec | None]],
    batch: int = 512,
) -> list[dict[str, float]]:
    """`evaluate_task` of one model on several clients' test sets `(x, y, task)` at once.

    The sets are concatenated and run through the model in batches of `batch` samples; a
    sample's output does not depend on the other samples of its batch (eval mode), so each
    client is scored on the outputs `evaluate_task` would give it. Cross-entropy clients are
    scored for all clients at once: per-sample losses and hits, summed per client in float64
    (the loss equals `evaluate_task`'s up to float32 summation order, ~1e-7 relative; the
    accuracy is the same count). Clients of other losses are scored one by one.
    """
    model.eval()
    if not tests:
        return []
    xs = torch.cat([x for x, _, _ in tests])
    outputs = torch.cat([model(xs[start : start + batch]) for start in range(0, len(xs), batch)])
    sizes = [len(y) for _, y, _ in tests]
    if all(task is None or task.loss == "cross_entropy" for _, _, task in tests):
        return cross_entropy_per_client(outputs, torch.cat([y for _, y, _ in tests]), sizes)
    results, offset = [], 0
    for (_, y, task), size in zip(tests, sizes, strict=True):
        metrics = MetricAccumulator(task)
        metrics.add(outputs[offset : offset + size], y)
        results.append(metrics.result())
        offset += size
    return results


def cross_entropy_per_client(
    outputs: torch.Tensor, targets: torch.Tensor, sizes: list[int]
) -> list[dict[str, float]]:
    """Each client's mean cross-entropy and accuracy over its `sizes[k]` consecutive rows."""
    owner = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    losses = F.cross_entropy(outputs.float(), targets, reduction="none").double()
    hits = (outputs.argmax(1) == targets).double()
    loss_sums = torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, owner, losses)
    hit_sums = torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, owner, hits)
    counts = torch.tensor(sizes, dtype=torch.float64).clamp(min=1)
    return [
        {"loss": loss, "accuracy": accuracy}
        for loss, accuracy in zip(
            (loss_sums / counts).tolist(), (hit_sums / counts).tolist(), strict=True
        )
    ]
