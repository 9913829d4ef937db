"""Batched local SGD: K clients of one architecture trained in lock-step with torch.func.

The maths is `training.local_sgd`'s, client by client. Client k has parameters θ_k, n
samples and its own seed s_k; each epoch draws its batch order π_k = randperm(n) from
Generator().manual_seed(s_k) (one generator per client, as the serial path), cut into
batches of `batch_size` (the last one smaller). At every step, for every k at once:

    ℓ_k = loss(f(θ_k; x_k[b]), y_k[b])        the task's loss (cross-entropy without a task)
    g_k = ∇θ ℓ_k                              vmap(grad_and_value) over the client axis
    g_k ← g_k · min(1, c / (‖g_k‖ + 1e-6))    clip_grad = c; ‖·‖ over all of θ_k (clip_grad_norm_)
    d_k = g_k + λ θ_k                         weight decay λ
    m_k = d_k (first step), μ m_k + d_k       momentum μ (torch.optim.SGD, no dampening)
    θ_k ← θ_k − η m_k                         (with μ = 0: θ_k ← θ_k − η d_k)

and client k's loss is the mean of its ℓ_k over all steps. Parameters the loss never
reaches (a FedMuscle projection) get no gradient in the serial path, so SGD leaves them
untouched; here they stay out of the differentiated set and are untouched as well.

Why: the serial path launches every kernel of a step once per client; with the K clients'
parameters stacked (stack_module_state) and the per-client gradient vmapped over the
stacked axis, one launch serves K clients. That is aimed at GPUs, where one small model
leaves the device idle; on a CPU thread the work is the same and little is gained.

`can_batch` says when the result matches the serial path: same class and state_dict
shapes, same sample count (batch shapes line up), same loss, one plain-SGD setting; no
Dropout (per-client draws cannot reproduce the serial path's torch.manual_seed(seed)) and
no BatchNorm (in-place running-stat updates do not vmap).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, stack_module_state, vmap
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
from torch.nn.modules.dropout import _DropoutNd

from raymtl.algorithms.base import LocalTrainingParams
from raymtl.algorithms.training import params_optimizer
from raymtl.flops import add_passes, paused
from raymtl.tasks.objectives import task_loss
from raymtl.tasks.spec import OptimizerSpec, TaskSpec

Tensors = dict[str, torch.Tensor]


def can_batch(models: Sequence[nn.Module], datas: Sequence, params, tasks: Sequence) -> bool:
    """True when `local_sgd_batched` computes exactly what `local_sgd` per client would.

    `datas`: each client's data, anything with `train_x` and `train_y` (e.g. ClientData).
    """
    if not models or not len(models) == len(datas) == len(tasks):
        return False
    if any(_unbatchable(module) for model in models for module in model.modules()):
        return False
    parameters = [p for model in models for p in model.parameters()]
    if not parameters or not all(p.requires_grad for p in parameters):
        return False
    if len({type(model) for model in models}) > 1 or len({_layout(m) for m in models}) > 1:
        return False
    data_layouts = {_data_layout(data.train_x, data.train_y) for data in datas}
    specs = {_optimizer_spec(task, params) for task in tasks}
    losses = {_loss_name(task) for task in tasks}
    return len(data_layouts) == len(losses) == len(specs) == 1 and specs.pop().name == "sgd"


def local_sgd_batched(
    models: list[nn.Module],
    train_xs: list[torch.Tensor],
    train_ys: list[torch.Tensor],
    params: LocalTrainingParams,
    seeds: list[int],
    tasks: list[TaskSpec | None],
) -> list[float]:
    """`local_sgd` for every client at once (call `can_batch` first); returns the mean losses.

    Each model's parameters are updated in place. As after the serial loop, the global RNG
    is left seeded with the last client's seed.
    """
    spec, task, n = _optimizer_spec(tasks[0], params), tasks[0], len(train_ys[0])
    for model in models:
        model.train()
    if n == 0:
        torch.manual_seed(seeds[-1])
        return [math.nan] * len(models)
    with paused():  # work the serial path does not do: not counted
        trainable, fixed = _stacked_state(models, task, train_xs[0][:1], train_ys[0][:1])
    step = vmap(grad_and_value(_client_loss(models[0], task)))
    xs, ys = torch.stack(train_xs), torch.stack(train_ys)
    rows = torch.arange(len(models), device=xs.device).unsqueeze(1)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    momenta: Tensors | None = None
    losses = []
    for _ in range(params.epochs):
        orders = torch.stack([torch.randperm(n, generator=g) for g in generators]).to(xs.device)
        for batch in orders.split(params.batch_size, dim=1):
            # The hooks would see one client's pass per vmapped call: count all K by hand.
            add_passes(models[0], train_xs[0][: batch.shape[1]], True, len(models))
            with paused():
                grads, loss = step(trainable, fixed, xs[rows, batch], ys[rows, batch])
            if params.clip_grad is not None:
                _clip_(grads, params.clip_grad)
            momenta = _sgd_step_(trainable, grads, momenta, spec)
            losses.append(loss)
    _write_back(models, trainable)
    torch.manual_seed(seeds[-1])  # the serial path's last torch.manual_seed(seed)
    return torch.stack(losses, dim=1).mean(dim=1).tolist()


def _client_loss(model: nn.Module, task: TaskSpec | None) -> Callable:
    """loss(trainable, fixed, x, y) of one client, running `model`'s forward functionally."""
    skeleton = copy.deepcopy(model).to("meta")  # its forward only; every tensor is passed in

    def loss(trainable: Tensors, fixed: Tensors, x: torch.Tensor, y: torch.Tensor):
        return task_loss(task, functional_call(skeleton, {**trainable, **fixed}, (x,)), y)

    return loss


def _stacked_state(models, task, x, y) -> tuple[Tensors, Tensors]:
    """(K, ...) stacks: the parameters the loss reaches, and everything else (constants)."""
    reached = _reached_parameters(models[0], task, x, y)
    stacked, buffers = stack_module_state(models)
    state = {name: t.detach() for name, t in {**stacked, **buffers}.items()}
    trainable = {name: t for name, t in state.items() if name in reached}
    return trainable, {name: t for name, t in state.items() if name not in reached}


def _reached_parameters(model, task, x, y) -> set[str]:
    """Names of the parameters that get a gradient (the serial optimiser skips the rest)."""
    named = dict(model.named_parameters())
    with torch.enable_grad():
        loss = task_loss(task, model(x), y)
        grads = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
    return {name for name, grad in zip(named, grads, strict=True) if grad is not None}


def _clip_(grads: Tensors, max_norm: float) -> None:
    """Per-client clip_grad_norm_: scale g_k by min(1, c / (‖g_k‖ + 1e-6)) in place."""
    norms = torch.stack(
        [torch.linalg.vector_norm(g.reshape(len(g), -1), dim=1) for g in grads.values()]
    )
    coef = (max_norm / (torch.linalg.vector_norm(norms, dim=0) + 1e-6)).clamp(max=1.0)
    for grad in grads.values():
        grad.mul_(coef.view(-1, *[1] * (grad.dim() - 1)))


def _sgd_step_(params: Tensors, grads: Tensors, momenta: Tensors | None, spec: OptimizerSpec):
    """One torch.optim.SGD step on the stacked parameters in place; returns the momenta."""
    new_momenta: Tensors = {}
    for name, param in params.items():
        direction = grads[name]
        if spec.weight_decay != 0:
            direction = direction.add(param, alpha=spec.weight_decay)
        if spec.momentum != 0:
            if momenta is None:
                new_momenta[name] = direction.clone()
            else:
                new_momenta[name] = momenta[name].mul_(spec.momentum).add_(direction)
            direction = new_momenta[name]
        param.add_(direction, alpha=-spec.lr)
    return new_momenta


@torch.no_grad()
def _write_back(models: Sequence[nn.Module], trainable: Tensors) -> None:
    for index, model in enumerate(models):
        for name, param in model.named_parameters():
            if name in trainable:
                param.copy_(trainable[name][index])


def _unbatchable(module: nn.Module) -> bool:
    stats = isinstance(module, _NormBase) and module.track_running_stats
    return isinstance(module, (_DropoutNd, _BatchNorm)) or stats


def _layout(model: nn.Module) -> tuple:
    return tuple((k, tuple(v.shape), v.dtype, v.device) for k, v in model.state_dict().items())


def _data_layout(x: torch.Tensor, y: torch.Tensor) -> tuple:
    return len(y), len(x), tuple(x.shape[1:]), tuple(y.shape[1:]), x.dtype, y.dtype, x.device


def _optimizer_spec(task: TaskSpec | None, params) -> OptimizerSpec:
    """The optimiser `build_optimizer` would pick for this client."""
    if task is not None and task.optimizer is not None:
        return task.optimizer
    return params_optimizer(params)


def _loss_name(task: TaskSpec | None) -> str:
    return "cross_entropy" if task is None else task.loss
