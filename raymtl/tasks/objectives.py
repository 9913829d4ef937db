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
are `evaluate_task`'s up to float32 rounding of the forward (the same accuracy count).

Layout independence: a client's numbers are bitwise the same whatever other clients are
evaluated with it (which clients a host holds), on a CPU and on a GPU under deterministic
algorithms. A kernel's rounding depends on the shapes it is given (a batch of 1 to 3 rows
takes other CPU kernels than one of 128; NHWC others than NCHW), never on the values of the
other rows in eval mode. So every forward call a client's rows go through has a shape that
depends only on the model, its device and the client's own test-set size: `evaluate_together`
calls the model on exactly `batch` rows (the last call zero-padded) and picks channels-last
per model and device; `evaluate_stacked` uses chunks of exactly `max_clients` clients and a
row count chosen from each client's own size (`stacked_rows`). A client's sums run over its
own rows only, on the outputs' device; only the few per-client results are copied to the
CPU.
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
    """The mean loss of `task` (None: cross-entropy on labels).

    Args:
        task: the task whose loss is taken; None: cross-entropy.
        outputs: the model's outputs for a batch.
        targets: the batch's targets (class ids, or floats for bce and mse).

    Returns:
        The mean loss, a scalar tensor.
    """
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
        sums = batch_sums(self.loss_kind, outputs, targets)
        self.loss_sum += float(sums.pop("loss"))
        self.samples += len(targets)
        self.entries += targets.numel()
        for name, value in sums.items():
            self.sums[name] += float(value)

    def result(self) -> dict[str, float]:
        if self.loss_kind == "cross_entropy":  # CE is summed per sample, the others per entry
            n = max(self.samples, 1)
            return {"loss": self.loss_sum / n, "accuracy": self.sums["correct"] / n}
        n = max(self.entries, 1)
        if self.loss_kind == "bce":
            counts = micro_prf(self.sums["tp"], self.sums["fp"], self.sums["fn"])
            return {"loss": self.loss_sum / n, **counts}
        return {"loss": self.loss_sum / n, "mse": self.sums["sq"] / n, "mae": self.sums["abs"] / n}


def batch_sums(loss_kind: str, outputs: torch.Tensor, targets: torch.Tensor) -> dict:
    """One batch's summed loss ("loss") and the counts its metrics are made of, as 0-d
    tensors on the outputs' device (`MetricAccumulator.add` turns them into floats)."""
    sums = {"loss": LOSSES[loss_kind](outputs, targets, reduction="sum")}
    if loss_kind == "cross_entropy":
        sums["correct"] = (outputs.argmax(1) == targets).sum()
    elif loss_kind == "bce":
        predicted, actual = outputs > 0, targets > 0.5  # σ(logit) > 0.5 ⇔ logit > 0
        sums["tp"] = (predicted & actual).sum()
        sums["fp"] = (predicted & ~actual).sum()
        sums["fn"] = (~predicted & actual).sum()
    else:
        error = outputs - targets
        sums["abs"] = error.abs().sum()
        sums["sq"] = (error**2).sum()
    return sums


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

    The sets are concatenated and run through the model (`faster_forward`) in calls of
    exactly `batch` rows, the last one zero-padded: a sample's output does not depend on the
    other rows of its call (eval mode), and every call has the same shape however many
    clients and samples the host holds, so each client's outputs are bitwise the same in
    every layout. The FLOPs counted are those of the real rows only. 128, not 512: a
    512-sample activation of `cnn_mnist` (51 MB) is above glibc's largest mmap threshold
    (32 MB), so every batch maps fresh pages and faults them in. Cross-entropy clients are
    scored for all clients at once: per-sample losses and hits, summed per client in float64
    (the loss equals `evaluate_task`'s up to float32 rounding; the accuracy is the same
    count). Clients of other losses are scored one by one.
    """
    model.eval()
    if not tests:
        return []
    xs = torch.cat([x for x, _, _ in tests])
    forward = faster_forward(model, xs)
    outputs = []
    for start in range(0, max(len(xs), 1), batch):  # one padded call even for no sample
        rows = xs[start : start + batch]
        if len(rows):
            add_passes(model, rows, torch.is_grad_enabled(), 1)
        with paused():  # counted above, without the padding
            outputs.append(forward(zero_padded(rows, batch))[: len(rows)])
    return score_per_client(torch.cat(outputs), tests, [len(y) for _, y, _ in tests])


def zero_padded(rows: torch.Tensor, length: int) -> torch.Tensor:
    """`rows` followed by zero rows up to `length` rows."""
    if len(rows) >= length:
        return rows
    return torch.cat([rows, rows.new_zeros((length - len(rows), *rows.shape[1:]))])


def faster_forward(model: nn.Module, xs: torch.Tensor) -> Callable:
    """`model`, or for images on the CPU, `model` run on a channels-last copy of its 4-D
    weights (`functional_call`; the module is left as it is). The choice depends on the
    model and the device only, never on how many samples there are: NHWC and NCHW round
    differently, so a client's numbers would otherwise depend on its host's other clients.

    Max pooling in torch's NCHW CPU kernel costs as much as the convolutions around it; in
    channels-last it is about 4x faster (benchmarks/RESULTS.md, "Evaluation at scale"). The
    copy is the convolutions' weights, once per call of `evaluate_together`.
    """
    state = {name: t.detach() for name, t in model.state_dict().items()}
    convolutional = [name for name, t in state.items() if t.dim() == 4]
    if xs.dim() != 4 or xs.device.type != "cpu" or not convolutional:
        return model
    if any(not state[name].is_contiguous() for name in convolutional):
        return model  # already channels-last (runtime.precision bf16-mixed)
    for name in convolutional:  # NHWC strides even where NCHW's also fit (one input channel)
        nhwc = torch.empty_like(state[name], memory_format=torch.channels_last)
        state[name] = nhwc.copy_(state[name])

    def forward(x: torch.Tensor) -> torch.Tensor:
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


# Above this many bytes of weights per model, stacking does not pay on a CPU: a one-sample
# client's pass reads its weights once, stacking first copies them (a read and a write), and
# vmap turns convolutions into grouped ones that run no faster than one by one
# (benchmarks/RESULTS.md, "Evaluation at scale").
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

    Models over `STACK_BYTES`, and clients with more test samples than `stacked_rows`
    stacks, are run client by client on their own tensors (`functional_call`, no copy) in
    calls of up to `batch` rows. The other clients go in chunks of exactly `max_clients`
    (the stacked copy of their weights is the memory this costs; slots no client of the
    chunk fills keep the weights of an earlier one), each chunk of clients with one row
    count R = `stacked_rows(n_k)`: their weights stacked to (max_clients, ...), their test
    sets zero-padded to (max_clients, R, ...), and `functional_call(skeleton, θ_k, x_k)`
    vmapped over k in one call. Eval mode (BatchNorm from its running statistics, passed as
    buffers; no dropout) makes a sample's output independent of the other rows and slots,
    so the padding changes nothing and is dropped before scoring (`score_per_client`); and
    every call's shape follows from the client's own size, so its numbers do not depend on
    which other clients are evaluated with it.
    """
    skeleton.eval()
    sizes = [len(y) for _, y, _ in tests]
    if not tests:
        return []
    small = sum(t.numel() * t.element_size() for t in weights[0].values()) <= STACK_BYTES
    outputs: list[torch.Tensor | None] = [None] * len(tests)
    by_rows: dict[int, list[int]] = {}  # the clients stacked, by their rows per call
    for k, (x, _, _) in enumerate(tests):
        rows = stacked_rows(sizes[k], batch, max_clients) if small else None
        if rows is not None:
            by_rows.setdefault(rows, []).append(k)
            continue
        outputs[k] = torch.cat(
            [
                functional_call(skeleton, weights[k], (x[start : start + batch],))
                for start in range(0, max(len(x), 1), batch)  # an empty set: one empty call
            ]
        )
    reused: dict[str, torch.Tensor] = {}  # the stacks' memory, written over chunk by chunk
    for rows, members in by_rows.items():
        for start in range(0, len(members), max_clients):
            chunk = members[start : start + max_clients]
            chunk_weights = [weights[k] for k in chunk]
            chunk_xs = [tests[k][0] for k in chunk]
            chunk_outputs = _stacked_forward(
                skeleton, chunk_weights, chunk_xs, rows, max_clients, reused
            )
            for slot, k in enumerate(chunk):
                outputs[k] = chunk_outputs[slot, : sizes[k]]
    return score_per_client(torch.cat([out for out in outputs if out is not None]), tests, sizes)


def stacked_rows(samples: int, batch: int = 512, max_clients: int = 32) -> int | None:
    """Rows per vmapped call (`evaluate_stacked`) of a client with `samples` test samples:
    the least power of two that holds them all (1 for none), or None above `batch //
    max_clients` samples (such a client is run on its own). The client's own size decides
    it, and the powers of two keep the kinds of chunk few (little padding, few part-filled
    chunks)."""
    if samples > max(1, batch // max_clients):
        return None
    return 1 << max(0, samples - 1).bit_length()


def _stacked_forward(
    skeleton: nn.Module,
    weights: list[dict[str, torch.Tensor]],
    xs: list[torch.Tensor],
    rows: int,
    slots: int,
    reused: dict[str, torch.Tensor],
) -> torch.Tensor:
    """(slots, rows, ...) outputs of up to `slots` clients' weights on their inputs
    zero-padded to `rows` rows, in one vmapped call. The stacks are written into `reused`:
    a fresh allocation of `slots` models' weights per chunk costs more in page faults than
    the copy itself."""
    for name, first in weights[0].items():
        if name not in reused:  # zeros: slots no client ever filled compute on zeros
            reused[name] = first.new_zeros((slots, *first.shape))
        torch.stack([w[name] for w in weights], out=reused[name][: len(weights)])
    padded = xs[0].new_zeros((slots, rows, *xs[0].shape[1:]))
    for k, x in enumerate(xs):
        padded[k, : len(x)] = x
    forward = vmap(lambda state, x: functional_call(skeleton, state, (x,)))
    return forward(reused, padded)


def cross_entropy_means(
    outputs: torch.Tensor, targets: torch.Tensor, sizes: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's mean cross-entropy and accuracy over its `sizes[k]` consecutive rows,
    as two float64 tensors of len(sizes) on the outputs' device: per-sample losses and hits
    summed per client (`index_add_`) where they were computed."""
    device = outputs.device
    counts = torch.tensor(sizes, device=device)
    owner = torch.repeat_interleave(
        torch.arange(len(sizes), device=device), counts, output_size=len(targets)
    )
    losses = F.cross_entropy(outputs.float(), targets, reduction="none").double()
    hits = (outputs.argmax(1) == targets).double()
    zeros = torch.zeros(len(sizes), dtype=torch.float64, device=device)
    loss_sums = zeros.clone().index_add_(0, owner, losses)
    hit_sums = zeros.index_add_(0, owner, hits)
    means = counts.double().clamp(min=1)
    return loss_sums / means, hit_sums / means


def cross_entropy_per_client(
    outputs: torch.Tensor, targets: torch.Tensor, sizes: list[int]
) -> list[dict[str, float]]:
    """Each client's mean cross-entropy and accuracy over its `sizes[k]` consecutive rows
    (`cross_entropy_means`), copied to the CPU in one transfer."""
    losses, accuracies = torch.stack(cross_entropy_means(outputs, targets, sizes)).cpu().tolist()
    return [
        {"loss": loss, "accuracy": accuracy}
        for loss, accuracy in zip(losses, accuracies, strict=True)
    ]
