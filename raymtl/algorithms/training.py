"""Local training, evaluation and model-as-tensors helpers shared by algorithms.

Determinism: every random draw of a local update (batch order, dropout) comes
from a seed derived from (experiment seed, round, client, purpose), so a client
trains identically whichever process hosts it, and a resumed run replays the
uninterrupted one exactly.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Collection, Sequence
from fractions import Fraction
from typing import NamedTuple

import torch
from torch import nn

from raymtl.algorithms.base import LocalTrainingParams, Message, State
from raymtl.tasks.objectives import build_optimizer, evaluate_task, task_loss
from raymtl.tasks.spec import OptimizerSpec, TaskSpec
from raymtl.toolbox.sample_level import active as sample_level_active

LossHook = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any printable parts (independent of PYTHONHASHSEED).

    Args:
        *parts: values whose `str` names the draw (the run's seed, the round, the
            participant, a purpose).

    Returns:
        A seed in 0..2^63-1, the same for the same parts in every process.
    """
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def sample_size(fraction: float, num_clients: int) -> int:
    """⌈m·N⌉ clients a round, from the decimal the user wrote for m: 0.28 of 25 clients is 7,
    where the float product (7.000000000000001) would round up to 8. At least one client."""
    exact = Fraction(repr(float(fraction))) * num_clients
    return min(num_clients, max(1, math.ceil(exact)))


def params_optimizer(params: LocalTrainingParams) -> OptimizerSpec:
    """The algorithm's own local SGD, used by tasks that name no optimiser."""
    return OptimizerSpec("sgd", params.lr, params.momentum, params.weight_decay)


class LocalRun(NamedTuple):
    """What a round of local training did: its mean batch loss and the optimiser steps it
    ran (τ: FedNova normalises by it, SCAFFOLD's option II divides by it)."""

    loss: float
    steps: int


def local_sgd(
    model: nn.Module,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    params: LocalTrainingParams,
    seed: int,
    loss_fn: LossHook | None = None,
    task: TaskSpec | None = None,
    max_steps: int | None = None,
) -> LocalRun:
    """`params.epochs` epochs of mini-batch training in place; returns the mean batch loss
    and the number of steps run (E·⌈n/B⌉, or `max_steps` when that is fewer).

    The loss is `loss_fn` when given, else the task's (cross-entropy without a task); the
    optimiser is the task's (fresh every call), else SGD with the algorithm's settings.
    `max_steps` ends the schedule after that many steps (partial work: FedProx's stragglers).

    Inside the host's sample-level DP scope (privacy.sample_level), the model and optimiser
    run as Opacus's DP-SGD (per-sample clipping, seeded noise: toolbox/sample_dp.py), and the
    run is added to the scope for the client's ε. Opacus privatises the gradients of the
    model's layers: a loss hook's terms on the parameters themselves (a proximal term) do
    not reach the private gradient.

    Args:
        model: the model to train, in place.
        train_x: the training inputs.
        train_y: the training targets.
        params: the local SGD settings (epochs, lr, batch_size, momentum, ...).
        seed: seeds the batch order and the dropout draws.
        loss_fn: `loss_fn(model, x, y) -> loss`; None: the task's loss.
        task: the client's task (its loss and optimiser); None: cross-entropy and SGD.
        max_steps: the most optimiser steps to run; None: every batch of every epoch.

    Returns:
        The mean batch loss and the number of steps run (`LocalRun`).
    """
    if loss_fn is None:
        loss_fn = lambda net, x, y: task_loss(task, net(x), y)  # noqa: E731
    torch.manual_seed(seed)  # dropout draws
    order_rng = torch.Generator().manual_seed(seed)
    optimizer = build_optimizer(model.parameters(), task, params_optimizer(params))
    private = sample_level_active()
    release = None
    if private is not None:
        from raymtl.toolbox.sample_dp import make_private

        noise = torch.Generator().manual_seed(derive_seed(seed, "sample-level-dp"))
        _, optimizer, release = make_private(model, optimizer, private[0], params.batch_size, noise)
    model.train()
    try:
        with warnings.catch_warnings():
            # Opacus's hooks on a first layer whose inputs need no gradient: torch's note
            # that the hook fires on the outputs' gradients, which is what Opacus uses.
            warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
            run = sgd_epochs(
                model, train_x, train_y, params, loss_fn, optimizer, order_rng, max_steps
            )
    finally:
        if release is not None:
            release()
    if private is not None:
        private[1].append((run.steps, len(train_y), params.batch_size))
    return run


def sgd_epochs(model, train_x, train_y, params, loss_fn, optimizer, order_rng, max_steps):
    """local_sgd's loop: `params.epochs` epochs of shuffled mini-batches (a LocalRun)."""
    losses = []
    for _ in range(params.epochs):
        order = torch.randperm(len(train_y), generator=order_rng)
        for batch in order.split(params.batch_size):
            if max_steps is not None and len(losses) >= max_steps:
                break
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model, train_x[batch], train_y[batch])
            loss.backward()
            if params.clip_grad is not None:
                nn.utils.clip_grad_norm_(model.parameters(), params.clip_grad)
            optimizer.step()
            losses.append(loss.detach())
    mean = float(torch.stack(losses).mean()) if losses else float("nan")
    return LocalRun(mean, len(losses))


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: TaskSpec | None = None
) -> dict:
    """Mean loss and the task's metrics (without a task: cross-entropy and accuracy).

    Args:
        model: the model to evaluate.
        x: the inputs.
        y: the targets.
        task: the task whose loss and metrics are computed; None: classification.

    Returns:
        The mean loss and each metric, by name.
    """
    return evaluate_task(model, x, y, task)


def model_tensors(model: nn.Module, prefixes: Sequence[str] | None = None) -> dict:
    """The model's floating-point state (parameters and float buffers), detached CPU copies.

    `prefixes` keeps only the entries whose name starts with one of them.

    Args:
        model: the model to copy.
        prefixes: keep only the entries whose name starts with one of them; None: all.

    Returns:
        The copies by state_dict name.
    """
    return {
        # CPU copies: messages travel through the (host-memory) object store.
        name: value.detach().to("cpu", copy=True)
        for name, value in model.state_dict().items()
        if value.is_floating_point()
        and (prefixes is None or any(name.startswith(p) for p in prefixes))
    }


def load_tensors(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Overwrite the named entries of the model's state (others untouched).

    Args:
        model: the model to load into, in place.
        tensors: tensors by state_dict name.
    """
    state = model.state_dict()
    for name, value in tensors.items():
        state[name].copy_(value)


def load_received(
    model: nn.Module, inbox: Sequence[Message], kinds: str | Collection[str] | None = None
) -> None:
    """Load what the received messages of `kinds` carry into `model`, in inbox order (entries
    no message names keep their values): a global model, an LPS's model, a regularised one.

    `kinds` None (the default) loads every message: right for an inbox that holds only
    models. An inbox that also brings other tensors under the parameters' names (SCAFFOLD's
    control variate beside the global model) names the model's kind, e.g. "global_model";
    messages of other kinds are then left alone.

    Args:
        model: the model to load into, in place.
        inbox: the step's received messages.
        kinds: the kind, or kinds, of the messages to load; None: every message.
    """
    wanted = (kinds,) if isinstance(kinds, str) else kinds
    for message in inbox:
        if wanted is None or message.kind in wanted:
            load_tensors(model, message.tensors)


def train_local_model(state: State, ctx, params) -> LocalRun:
    """One round of plain local SGD on the client's own data (shared by algorithms); its
    mean loss is also the client's `train_loss`.

    Args:
        state: the client's state: its model is trained in place on its data, and its
            extras get `train_loss`.
        ctx: the step's context (its seed, round and participant seed the run).
        params: the local SGD settings (`LocalTrainingParams`).

    Returns:
        The mean batch loss and the number of steps run (`LocalRun`).
    """
    data = state.data
    seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
    # The client's task decides its loss and optimiser (None: cross-entropy, the params' SGD).
    run = local_sgd(state.model, data.train_x, data.train_y, params, seed, task=data.task)
    state.extras["train_loss"] = run.loss
    return run
