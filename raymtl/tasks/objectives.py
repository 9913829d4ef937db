"""A task's loss, local optimiser and evaluation metrics, as plain torch.

    cross_entropy  CE(logits, y)                       accuracy = mean[argmax = y]
    bce            mean BCE(σ(logits), y) per entry    micro P = TP/(TP+FP), R = TP/(TP+FN),
                                                       F1 = 2PR/(P+R); ŷ = [σ(logit) > 0.5]
    mse            mean (out − y)² per entry           mse, mae = mean |out − y| per entry

Micro averaging counts TP/FP/FN over every (sample, attribute) pair, as scikit-learn's
`precision_recall_fscore_support(average="micro")`; an empty denominator gives 0.

Evaluating many clients: `evaluate_together` runs clients that share one model through it
together; `evaluate_stacked` runs clients that each have their own weights of one
architecture together: for small models their weights stacked on a leading client axis k
and the forward vmapped over it (torch.func), outputs_k = f(θ_k; x_k) for every k in one
call; for large ones (where stacking costs more than it saves on a CPU) one functional call
per client on its own tensors. Each client is scored on its own rows only, so its metrics
are `evaluate_task`'s up to float32 rounding of the forward (~1e-7 relative; the same
accuracy count).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from raymtl.flops import add_passes, paused
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
    batch: int = 128,
) -> list[dict[str, float]]:
    """`evaluate_task` of one model on several clients' test sets `(x, y, task)` at once.

    The sets are concatenated and run through the model (`faster_forward`) in batches of
    `batch` samples; a sample's output does not depend on the other samples of its batch
    (eval mode), so each client is scored on the outputs `evaluate_task` would give it. 128,
    not 512: a 512-sample activation of `cnn_mnist` (51 MB) is above glibc's largest mmap
    threshold (32 MB), so every batch maps fresh pages and faults them in (10,000 samples
    in a Ray actor: 1.4-1.6 s at 128 against 1.7-2.0 s at 512). Cross-entropy clients are
    scored for all clients at once: per-sample losses and hits, summed per client in float64
    (the loss equals `evaluate_task`'s up to float32 summation order, ~1e-7 relative; the
    accuracy is the same count). Clients of other losses are scored one by one.
    """
    model.eval()
    if not tests:
        return []
    xs = torch.cat([x for x, _, _ in tests])
    forward = faster_forward(model, xs, batch)
    outputs = torch.cat([forward(xs[start : start + batch]) for start in range(0, len(xs), batch)])
    return score_per_client(outputs, tests, [len(y) for _, y, _ in tests])


def faster_forward(model: nn.Module, xs: torch.Tensor, batch: int) -> Callable:
    """`model`, or for more than a batch of images on the CPU, `model` run on a
    channels-last copy of its 4-D weights (`functional_call`; the module is left as it is).

    Max pooling in torch's NCHW CPU kernel costs as much as the convolutions around it; in
    channels-last it is about 4x faster, and the whole pass of `cnn_mnist` about 1.8x (2
    cores, torch 2.14.1: 10,000 samples in 1.5 s against 2.6 s). The copy is the weights
    once. The outputs differ from NCHW's in float32 rounding only (~1e-7, as another batch
    size gives), which `evaluate_together`'s contract already allows.
    """
    state = {name: t.detach() for name, t in model.state_dict().items()}
    convolutional = [name for name, t in state.items() if t.dim() == 4]
    if xs.dim() != 4 or xs.device.type != "cpu" or len(xs) <= batch or not convolutional:
        return model
    if any(not state[name].is_contiguous() for name in convolutional):
        return model  # already channels-last (runtime.precision bf16-mixed)
    for name in convolutional:  # NHWC strides even where NCHW's also fit (one input channel)
        nhwc = torch.empty_like(state[name], memory_format=torch.channels_last)
        state[name] = nhwc.copy_(state[name])

    def forward(x: torch.Tensor) -> torch.Tensor:
        # The FLOPs hooks cannot copy a module whose parameters are swapped out: the pass
        # is counted by hand, on the module as it is (the same count as the NCHW pass).
        add_passes(model, x, torch.is_grad_enabled(), 1)
        with paused():
            return functional_call(model, state, (x,))

    return forward


def score_per_client(
    outputs: torch.Tensor,
    tests: list[tuple[torch.Tensor, torch.Tensor, TaskSpec | None]],
    sizes: list[int],
) -> list[dict[str, float]]:
    """Each client's metrics from its `sizes[k]` consecutive rows of `outputs`: all
    cross-entropy clients at once, clients of other losses one by one."""
    if all(task is None or task.loss == "cross_entropy" for _, _, task in tests):
        return cross_entropy_per_client(outputs, torch.cat([y for _, y, _ in tests]), sizes)
    results, offset = [], 0
    for (_, y, task), size in zip(tests, sizes, strict=True):
        metrics = MetricAccumulator(task)
        metrics.add(outputs[offset : offset + size], y)
        results.append(metrics.result())
        offset += size
    return results


# Above this many bytes of weights per model, stacking does not pay on a CPU. A one-sample
# client's pass reads its weights once; stacking first copies them (a read and a write), and
# vmap turns convolutions into grouped ones that run no faster than one by one. Measured on
# 2 cores (torch 2.14.1), ms per one-sample client, stacked against a functional_call per
# client: logreg (31 KB) 0.02 against 0.1, mlp (100 KB) 0.03 against 0.12, cnn_mnist (6.6 MB) 3.5
# against 1.5 (benchmarks/RESULTS.md, "Evaluation at scale").
STACK_BYTES = 1 << 20


@torch.no_grad()
def evaluate_stacked(
    skeleton: nn.Module,
    weights: list[dict[str, torch.Tensor]],
    tests: list[tuple[torch.Tensor, torch.Tensor, TaskSpec | None]],
    batch: int = 512,
    max_clients: int = 32,
) -> list[dict[str, float]]:
    """`evaluate_task` of client k's weights `weights[k]` on its test set `tests[k]`, for
    clients whose models share one architecture: `skeleton`'s class, and the names, shapes
    and dtypes of every entry of `weights[k]` (its state_dict: parameters and buffers).

    Models over `STACK_BYTES` are run client by client on their own tensors
    (`functional_call`, no copy). Smaller ones are taken in chunks of at most `max_clients`
    (the stacked copy of their weights is the memory this costs) and about `batch` samples:
    their weights stacked to (K, ...),
    their test sets zero-padded to the chunk's longest, and `functional_call(skeleton, θ_k,
    x_k)` vmapped over k. Eval mode (BatchNorm from its running statistics, passed as
    buffers; no dropout) makes a sample's output independent of the other rows, so the
    padding changes nothing and is dropped before scoring (`score_per_client`).
    """
    skeleton.eval()
    sizes = [len(y) for _, y, _ in tests]
    if not tests:
        return []
    if sum(t.numel() * t.element_size() for t in weights[0].values()) > STACK_BYTES:
        rows = [
            functional_call(skeleton, w, (x[start : start + batch],))
            for w, (x, _, _) in zip(weights, tests, strict=True)
            for start in range(0, len(x), batch)
        ]
        return score_per_client(torch.cat(rows), tests, sizes)
    outputs: list[torch.Tensor | None] = [None] * len(tests)
    order = sorted(range(len(tests)), key=lambda k: sizes[k])  # little padding in a chunk
    reused: dict[str, torch.Tensor] = {}  # the stacks' memory, written over chunk by chunk
    start = 0
    while start < len(order):
        longest = max(1, sizes[order[start]])
        fits = max(1, min(max_clients, batch // longest))
        chunk = order[start : start + fits]
        longest = max(1, max(sizes[k] for k in chunk))
        chunk_weights = [weights[k] for k in chunk]
        chunk_xs = [tests[k][0] for k in chunk]
        chunk_outputs = _stacked_forward(skeleton, chunk_weights, chunk_xs, longest, batch, reused)
        for k, rows in zip(chunk, chunk_outputs, strict=True):
            outputs[k] = rows[: sizes[k]]
        start += len(chunk)
    return score_per_client(torch.cat([out for out in outputs if out is not None]), tests, sizes)


def _stacked_forward(
    skeleton: nn.Module,
    weights: list[dict[str, torch.Tensor]],
    xs: list[torch.Tensor],
    longest: int,
    batch: int,
    reused: dict[str, torch.Tensor],
) -> torch.Tensor:
    """(K, longest, ...) outputs of K clients' weights on their zero-padded inputs. The
    stacks are written into `reused` (grown when a chunk is larger): a fresh allocation of
    K models' weights per chunk costs more in page faults than the copy itself."""
    stacked = {}
    for name, first in weights[0].items():
        shape = (len(weights), *first.shape)
        if name not in reused or len(reused[name]) < len(weights):
            reused[name] = first.new_empty(shape)
        stacked[name] = torch.stack([w[name] for w in weights], out=reused[name][: len(weights)])
    padded = xs[0].new_zeros((len(xs), longest, *xs[0].shape[1:]))
    for k, x in enumerate(xs):
        padded[k, : len(x)] = x
    forward = vmap(lambda state, x: functional_call(skeleton, state, (x,)))
    rows = max(1, batch // len(xs))  # about `batch` samples per call, all clients together
    return torch.cat(
        [forward(stacked, padded[:, start : start + rows]) for start in range(0, longest, rows)],
        dim=1,
    )


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
