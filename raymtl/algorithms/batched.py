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

Dropout: the serial path calls torch.manual_seed(s_k) and every nn.Dropout of a step
draws its mask from the global generator of the model's device, layer after layer in
forward order. Here the functional copy's nn.Dropout layers multiply by masks passed in as
vmapped inputs. Before each step, client k's masks are drawn by the call the serial layer
makes, F.dropout, on ones of the layer input's shape, dtype and strides (recorded once per
batch size by a pass of one client), under the device's global generator set to client k's
state, which starts as torch.manual_seed(s_k) leaves it and is saved after each draw.
ones · noise = noise, so the masks are the serial ones bit for bit, and x · mask is the
serial product. Afterwards every generator is left as the serial loop leaves it: seeded
with the last client's seed, the device's advanced by that client's draws. (A model held in
float16 or bfloat16 on CUDA is the exception: the fused kernel scales x by 1/(1-p) in
float32, x · mask rounds that factor first, which changes nothing when it is a power of 2.)

Batch normalisation: running_mean, running_var and num_batches_tracked are stacked like
the parameters and passed as batched inputs; BatchNorm's in-place updates land in client
k's slice and are written back with the parameters after training.

Tolerance: the batched kernels sum in another order than the serial ones (a vmapped
convolution is one grouped convolution over the K clients), so the paths agree to float32
rounding, not bit for bit (in float64, to float64 rounding). TOLERANCE, 1e-5 absolute on
parameters, buffers and losses, is what the tests hold them to after two epochs of small
models. It is not a bound: where the serial float32 training is itself ill-conditioned
(many steps on noise; a ResNet whose last stages normalise 1x1 maps of a few samples),
rounding grows, and the batched result is about as far from the serial one as the serial
one is from the same training in float64. `rounding_tolerance` gives the gap a whole run
may show, from the dtype's epsilon and the sums its steps make; in float64 the two paths
agree to float64 rounding (tests/integration/test_batched_rounding.py; the gaps measured on
gpu_check's `batch_clients 4 = 1` case are in benchmarks/RESULTS.md, "Batched rounding").

`batch_refusal` says, in one line, why some clients cannot train together (None when they
can; `can_batch` is "refusal is None"): different classes, layouts, sample counts, losses
or optimisers; frozen parameters; dropout other than nn.Dropout, or random draws outside
it; running statistics other than BatchNorm's, or BatchNorm with momentum=None (its
cumulative average reads num_batches_tracked as a Python number); autocast
(runtime.precision bf16-mixed), under which a vmapped convolution stays in float32 while
the serial one runs in bfloat16.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, stack_module_state, vmap
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.dropout import _DropoutNd
from torch.utils._python_dispatch import TorchDispatchMode

from raymtl.algorithms.base import LocalTrainingParams, State
from raymtl.algorithms.training import (
    LocalRun,
    derive_seed,
    local_sgd,
    params_optimizer,
    train_local_model,
)
from raymtl.flops import add_passes, paused
from raymtl.tasks.objectives import task_loss
from raymtl.tasks.spec import OptimizerSpec, TaskSpec

log = logging.getLogger(__name__)
Tensors = dict[str, torch.Tensor]

# Absolute tolerance of the batched path against the serial one in float32 (parameters, BN
# buffers, losses): rounding of reordered sums, see the module docstring.
TOLERANCE = 1e-5
# Layers whose sums `step_sums` counts (batch norms: BATCHED_NORMS).
SUMMING_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
# Norm layers whose running statistics train batched (passed in as batched buffers).
BATCHED_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
# Devices whose global generator the dropout masks are drawn under (get/set_rng_state).
MASK_DEVICES = ("cpu", "cuda")
# Autocast does not reach into torch.func's batched kernels as into the serial pass.
AUTOCAST_REFUSAL = (
    "under autocast (runtime.precision: bf16-mixed) vmapped layers do not compute in "
    "bfloat16 as the serial ones do"
)


@dataclass(frozen=True)
class Refusal:
    """Why some clients cannot train together: `reason` is the same whatever the round (a
    caller says it once), `detail` the values that differ this time (sample counts)."""

    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})" if self.detail else self.reason


def can_batch(models: Sequence[nn.Module], datas: Sequence, params, tasks: Sequence) -> bool:
    """True when `local_sgd_batched` computes what `local_sgd` per client would (within
    TOLERANCE): `batch_refusal` finds no reason against it."""
    return batch_refusal(models, datas, params, tasks) is None


def batch_refusal(
    models: Sequence[nn.Module], datas: Sequence, params, tasks: Sequence
) -> Refusal | None:
    """Why `local_sgd_batched` cannot train these clients as `local_sgd` would one by one,
    or None when it can.

    `datas`: each client's data, anything with `train_x` and `train_y` (e.g. ClientData).
    """
    if not models or not len(models) == len(datas) == len(tasks):
        sizes = f"{len(models)} models, {len(datas)} data, {len(tasks)} tasks"
        return Refusal("the clients' models, data and tasks do not line up", sizes)
    classes = sorted({type(model).__name__ for model in models})
    if len(classes) > 1:
        return Refusal("their model classes differ", ", ".join(classes))
    if len({_layout(model) for model in models}) > 1:
        return Refusal("their parameter shapes, buffers or layer settings differ")
    parameters = [p for model in models for p in model.parameters()]
    if not parameters:
        return Refusal("the model has no parameters")
    if not all(p.requires_grad for p in parameters):
        return Refusal("some parameters are frozen (requires_grad=False)")
    layer_refusal = _layer_refusal(models[0])
    if layer_refusal is not None:
        return layer_refusal
    if torch.is_autocast_enabled(parameters[0].device.type):
        return Refusal(AUTOCAST_REFUSAL)
    counts = [len(data.train_y) for data in datas]
    if len(set(counts)) > 1:
        return Refusal("their sample counts differ", ", ".join(map(str, counts)))
    if len({_data_layout(data.train_x, data.train_y) for data in datas}) > 1:
        return Refusal("their data's shapes, dtypes or devices differ")
    losses = sorted({_loss_name(task) for task in tasks})
    if len(losses) > 1:
        return Refusal("their losses differ", ", ".join(losses))
    specs = {_optimizer_spec(task, params) for task in tasks}
    others = sorted({spec.name for spec in specs} - {"sgd"})
    if others:
        return Refusal("a task's optimiser is not SGD", ", ".join(others))
    if len(specs) > 1:
        return Refusal("their SGD settings differ (lr, momentum or weight decay)")
    return _forward_refusal(models[0], datas[0], params, tasks[0])


def local_sgd_batched(
    models: list[nn.Module],
    train_xs: list[torch.Tensor],
    train_ys: list[torch.Tensor],
    params: LocalTrainingParams,
    seeds: list[int],
    tasks: list[TaskSpec | None],
) -> list[LocalRun]:
    """`local_sgd` for every client at once (call `can_batch` first); returns each client's
    mean loss and steps (the same count for all: their sample counts are equal).

    Each model's parameters and buffers (BatchNorm's running statistics) are updated in
    place. As after the serial loop, every global generator is left seeded with the last
    client's seed, the models' device's advanced by that client's dropout draws.
    """
    spec, task, n = _optimizer_spec(tasks[0], params), tasks[0], len(train_ys[0])
    for model in models:
        model.train()
    if n == 0:
        torch.manual_seed(seeds[-1])
        return [LocalRun(math.nan, 0) for _ in models]
    device = next(models[0].parameters()).device
    forward = _Forward(models[0])
    first = min(params.batch_size, n)
    reached, _ = _meta_findings(models[0], task, train_xs[0][:first], train_ys[0][:first])
    with paused():  # work the serial path does not do: not counted
        trainable, fixed = _stacked_state(models, reached)
    step = vmap(grad_and_value(_client_loss(forward, task)))
    xs, ys = torch.stack(train_xs), torch.stack(train_ys)
    clients = torch.arange(len(models), device=xs.device).unsqueeze(1)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    rng_states = _seeded_states(seeds, device)  # each client's dropout generator
    layouts: dict[int, list[_MaskLayout]] = {}  # the dropout inputs, by batch size
    momenta: Tensors | None = None
    losses = []
    for _ in range(params.epochs):
        orders = torch.stack([torch.randperm(n, generator=g) for g in generators]).to(xs.device)
        for batch in orders.split(params.batch_size, dim=1):
            size = batch.shape[1]
            # The hooks would see one client's pass per vmapped call: count all K by hand.
            add_passes(models[0], train_xs[0][:size], True, len(models))
            with paused():
                if forward.draws and size not in layouts:
                    layouts[size] = forward.record(_first_client(trainable, fixed), xs[0, :size])
                masks = _draw_masks(layouts.get(size, []), rng_states, device)
                grads, loss = step(trainable, fixed, xs[clients, batch], ys[clients, batch], masks)
            if params.clip_grad is not None:
                _clip_(grads, params.clip_grad)
            momenta = _sgd_step_(trainable, grads, momenta, spec)
            losses.append(loss)
    _write_back(models, trainable, fixed)
    torch.manual_seed(seeds[-1])  # the serial path's last torch.manual_seed(seed) ...
    _set_rng_state(device, rng_states[-1])  # ... and its last client's dropout draws
    means = torch.stack(losses, dim=1).mean(dim=1).tolist()
    return [LocalRun(mean, len(losses)) for mean in means]


def batched_equals_serial(
    model_name: str,
    device: str | torch.device = "cpu",
    clients: int = 3,
    input_shape: tuple[int, int, int] = (1, 8, 8),
    samples: int = 20,
    params: LocalTrainingParams | None = None,
) -> float:
    """The largest absolute difference, over every client's parameters, buffers and loss,
    between `local_sgd` client by client and `local_sgd_batched` (a check a GPU machine
    runs: compare it with TOLERANCE). Seeded clients of `model_name` on random data."""
    from raymtl.models import build_model  # the registry: only this check builds models

    params = params or LocalTrainingParams(
        epochs=2, lr=0.05, batch_size=8, momentum=0.9, weight_decay=1e-4, clip_grad=1.0
    )
    generator = torch.Generator().manual_seed(0)
    models, xs, ys = [], [], []
    for client in range(clients):
        torch.manual_seed(100 + client)
        models.append(build_model(model_name, input_shape, 5).to(device))
        xs.append(torch.randn(samples, *input_shape, generator=generator).to(device))
        ys.append(torch.randint(0, 5, (samples,), generator=generator).to(device))
    seeds, tasks = [11 * (client + 1) for client in range(clients)], [None] * clients
    datas = [_Data(x, y) for x, y in zip(xs, ys, strict=True)]
    refusal = batch_refusal(models, datas, params, tasks)
    if refusal is not None:
        raise ValueError(f"{model_name}: not batched: {refusal}")
    serial, batched = [copy.deepcopy(m) for m in models], [copy.deepcopy(m) for m in models]
    serial_runs = [
        local_sgd(model, x, y, params, seed)
        for model, x, y, seed in zip(serial, xs, ys, seeds, strict=True)
    ]
    batched_runs = local_sgd_batched(batched, xs, ys, params, seeds, tasks)
    # Step counts must agree exactly: any difference is a gap of at least 1.
    gaps = [
        max(abs(a.loss - b.loss), abs(a.steps - b.steps))
        for a, b in zip(serial_runs, batched_runs, strict=True)
    ]
    for one, other in zip(serial, batched, strict=True):
        theirs = other.state_dict()
        gaps += [
            (value - theirs[name]).abs().max().item() for name, value in one.state_dict().items()
        ]
    return max(gaps)


def step_sums(model: nn.Module, x: torch.Tensor) -> list[int]:
    """The lengths of the sums one training step on batch `x` makes in `model`'s
    convolutions, linear layers and batch norms, forward and backward: a convolution or
    linear layer sums C_in/groups·k (its output), C_out/groups·k (the input's gradient)
    and N·H·W (the weight's gradient; N rows for a linear layer); a batch norm sums N·H·W
    values four times (mean and variance; the two sums of its backward). Shapes come from
    one pass on the meta device (nothing is computed)."""
    skeleton, sums = _meta_copy(model).train(), []

    def note(module, inputs, output) -> None:
        if isinstance(module, BATCHED_NORMS):
            sums.extend([inputs[0].numel() // inputs[0].shape[1]] * 4)
        elif isinstance(module, nn.Linear):
            rows = output.numel() // output.shape[-1]
            sums.extend([module.in_features, module.out_features, rows])
        else:
            kernel = math.prod(module.kernel_size)
            sums.append(module.in_channels // module.groups * kernel)
            sums.append(module.out_channels // module.groups * kernel)
            sums.append(output.shape[0] * math.prod(output.shape[2:]))

    hooks = [
        module.register_forward_hook(note)
        for module in skeleton.modules()
        if isinstance(module, (*SUMMING_LAYERS, *BATCHED_NORMS))
    ]
    try:
        with torch.no_grad(), paused():
            skeleton(torch.empty_like(x, device="meta"))
    finally:
        for hook in hooks:
            hook.remove()
    return sums


def rounding_tolerance(
    model: nn.Module, x: torch.Tensor, steps: int, scale: float = 1.0, dtype=torch.float32
) -> float:
    """The absolute gap two correct trainings of `model` in `dtype` may show after `steps`
    SGD steps on batches like `x` (batched against serial; one CPU's kernels against
    another's), in a figure of magnitude `scale` (a loss):

        2 · ε · max(1, scale) · steps · Σ_s √n_s

    ε is the dtype's machine epsilon (float32: 2^-23 ≈ 1.19e-7); n_s the length of each sum
    a step makes (`step_sums`). Rounding a sum of n terms errs by about √n·ε of its size
    (Higham & Mary's probabilistic bound; n·ε at worst); the errors of a step's sums add up,
    and so do the steps'; each run is that far from the exact result, so two runs are twice
    as far apart. A first-order model, not a worst-case bound: it holds for the few steps of
    a check (resnet8 in gpu_check: 3.2e-3 against a largest gap of 1.3e-4 measured between
    float32 runs on different kernels), not for long runs, where a batch norm's
    amplification of rounding compounds round after round."""
    depth = sum(math.sqrt(n) for n in step_sums(model, x))
    return 2 * torch.finfo(dtype).eps * max(1.0, scale) * steps * depth


@dataclass(frozen=True)
class _Data:
    train_x: torch.Tensor
    train_y: torch.Tensor


def _client_loss(forward: _Forward, task: TaskSpec | None) -> Callable:
    """loss(trainable, fixed, x, y, masks) of one client, running the model functionally."""

    def loss(trainable: Tensors, fixed: Tensors, x, y, masks: list[torch.Tensor]):
        return task_loss(task, forward({**trainable, **fixed}, x, masks), y)

    return loss


def _stacked_state(models, reached: set[str]) -> tuple[Tensors, Tensors]:
    """(K, ...) stacks: the parameters the loss reaches, and everything else (the other
    parameters, constants; the buffers, which BatchNorm updates in place)."""
    stacked, buffers = stack_module_state(models)
    state = {name: t.detach() for name, t in {**stacked, **buffers}.items()}
    trainable = {name: t for name, t in state.items() if name in reached}
    return trainable, {name: t for name, t in state.items() if name not in reached}


def _first_client(trainable: Tensors, fixed: Tensors) -> Tensors:
    """Client 0's tensors; its buffers copied (a pass must not update the stacked ones)."""
    return {name: t[0] for name, t in trainable.items()} | {
        name: t[0].clone() for name, t in fixed.items()
    }


@dataclass(frozen=True)
class _MaskLayout:
    """The input of one dropout call: its mask is drawn on ones laid out as it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    p: float
    inplace: bool


class _MaskFeed:
    """What the `_MaskedDropout` layers of one forward do: record their inputs' layouts
    (while `layouts` is a list), else multiply by the next of `masks`, in call order."""

    def __init__(self) -> None:
        self.layouts: list[_MaskLayout] | None = None
        self.masks: Iterator[torch.Tensor] | None = None


class _MaskedDropout(nn.Module):
    """nn.Dropout(p) in training as a product with a mask drawn outside the forward: in a
    vmapped forward, client k's mask, drawn as its serial training would draw it."""

    def __init__(self, dropout: nn.Dropout, feed: _MaskFeed) -> None:
        super().__init__()
        self.p, self.inplace, self.feed = dropout.p, dropout.inplace, feed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0 or x.numel() == 0:  # at::dropout returns its input: no draw
            return x
        if self.p == 1:  # at::dropout multiplies by zero: no draw
            return x.mul_(0) if self.inplace else x * 0
        if self.feed.layouts is not None:
            self.feed.layouts.append(
                _MaskLayout(tuple(x.shape), x.stride(), x.dtype, self.p, self.inplace)
            )
            return x
        mask = next(self.feed.masks, None) if self.feed.masks is not None else None
        if mask is None:
            raise RuntimeError("a dropout layer ran more often than when its inputs were recorded")
        return x.mul_(mask) if self.inplace else x * mask


class _Forward:
    """A model's forward as a function of its tensors: a copy on the meta device (no weight
    copied; functional_call passes them in), its nn.Dropout layers `_MaskedDropout`s."""

    def __init__(self, model: nn.Module) -> None:
        self.skeleton = _meta_copy(model).train()
        self.feed = _MaskFeed()
        replaced: dict[int, _MaskedDropout] = {}
        for parent in list(self.skeleton.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Dropout:
                    masked = replaced.setdefault(id(child), _MaskedDropout(child, self.feed))
                    setattr(parent, name, masked)
        self.draws = any(0 < masked.p < 1 for masked in replaced.values())

    def __call__(self, tensors: Tensors, x: torch.Tensor, masks: list[torch.Tensor]):
        self.feed.masks = iter(masks)
        try:
            output = functional_call(self.skeleton, tensors, (x,))
            if next(self.feed.masks, None) is not None:
                raise RuntimeError(
                    "a dropout layer ran less often than when its inputs were recorded"
                )
        finally:
            self.feed.masks = None
        return output

    @torch.no_grad()
    def record(self, tensors: Tensors, x: torch.Tensor) -> list[_MaskLayout]:
        """The layouts of the dropout layers' inputs in a pass on `x`, in call order."""
        self.feed.layouts = []
        try:
            functional_call(self.skeleton, tensors, (x,))
            return self.feed.layouts
        finally:
            self.feed.layouts = None

    def meta_pass(self, task, x: torch.Tensor, y: torch.Tensor) -> tuple[set[str], list[str]]:
        """One training pass on the meta device, with shapes of `x` and `y`: the names of
        the parameters the loss reaches (the serial optimiser skips the rest) and the random
        ops it calls (dropout layers aside)."""
        named = dict(self.skeleton.named_parameters())
        x, y = torch.empty_like(x, device="meta"), torch.empty_like(y, device="meta")
        self.feed.layouts = []
        try:
            with paused(), _RandomOps() as random_ops, torch.enable_grad():
                loss = task_loss(task, self.skeleton(x), y)
                grads = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
        finally:
            self.feed.layouts = None
        reached = {name for name, grad in zip(named, grads, strict=True) if grad is not None}
        return reached, random_ops.ops


def _meta_findings(model: nn.Module, task, x, y) -> tuple[frozenset[str], tuple[str, ...]]:
    """`_Forward.meta_pass` of `model` on the shapes of `x` and `y`, once per kind of model
    (class, layout) and shapes in a process: on the meta device, batch norm runs Python
    decompositions, too slow to repeat for every batch of every round."""
    key = (type(model), _layout(model), tuple(x.shape), x.dtype, tuple(y.shape), y.dtype)
    key += (_loss_name(task),)
    if key not in _META_PASSES:
        if len(_META_PASSES) >= _META_PASSES_KEPT:
            del _META_PASSES[next(iter(_META_PASSES))]  # the oldest
        reached, random_ops = _Forward(model).meta_pass(task, x, y)
        _META_PASSES[key] = frozenset(reached), tuple(random_ops)
    return _META_PASSES[key]


_META_PASSES: dict[tuple, tuple[frozenset[str], tuple[str, ...]]] = {}
_META_PASSES_KEPT = 64


class _RandomOps(TorchDispatchMode):
    """Notes every random op (aten's nondeterministic_seeded tag) that runs under it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _meta_copy(model: nn.Module) -> nn.Module:
    """A deepcopy of `model` whose parameters and buffers are empty meta tensors: the
    memo hands deepcopy the meta tensors, so no weight is ever copied."""
    memo: dict[int, object] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        meta = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(model, memo)


def _seeded_states(seeds: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """The state of `device`'s global generator after torch.manual_seed(s), for each s."""
    states = []
    for seed in seeds:
        torch.manual_seed(seed)
        states.append(_rng_state(device))
    return states


def _draw_masks(layouts: list[_MaskLayout], states: list[torch.Tensor], device) -> list:
    """One step's dropout masks, each call's stacked over the clients: client k's drawn by
    F.dropout on ones under `device`'s global generator in state k (saved back after)."""
    if not layouts:
        return []
    drawn = []
    for client, state in enumerate(states):
        _set_rng_state(device, state)
        drawn.append([_mask(layout, device) for layout in layouts])
        states[client] = _rng_state(device)
    return [torch.stack(masks) for masks in zip(*drawn, strict=True)]


def _mask(layout: _MaskLayout, device: torch.device) -> torch.Tensor:
    ones = torch.empty_strided(layout.shape, layout.stride, dtype=layout.dtype, device=device)
    return F.dropout(ones.fill_(1), layout.p, training=True, inplace=layout.inplace)


def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


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
def _write_back(models: Sequence[nn.Module], trainable: Tensors, fixed: Tensors) -> None:
    """The trained parameters and the updated buffers back into each client's model."""
    for index, model in enumerate(models):
        for name, param in model.named_parameters():
            if name in trainable:
                param.copy_(trainable[name][index])
        for name, buffer in model.named_buffers():
            buffer.copy_(fixed[name][index])


def _layer_refusal(model: nn.Module) -> Refusal | None:
    """A layer whose training the batched path does not reproduce, named."""
    device = next(model.parameters()).device
    for name, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, _DropoutNd) and type(module) is not nn.Dropout:
            return Refusal(f"only nn.Dropout masks are reproduced, not its {kind}'s", name)
        if type(module) is nn.Dropout and 0 < module.p < 1 and device.type not in MASK_DEVICES:
            return Refusal(
                f"dropout masks are reproduced on {' and '.join(MASK_DEVICES)} only", device.type
            )
        if isinstance(module, _NormBase) and module.track_running_stats:
            if type(module) not in BATCHED_NORMS:
                return Refusal(f"only BatchNorm's running statistics batch, not its {kind}'s", name)
            if module.momentum is None:
                return Refusal(f"its {kind}'s momentum is None: a cumulative average", name)
    return None


def _forward_refusal(model: nn.Module, data, params, task) -> Refusal | None:
    """What a pass on the meta device shows: a forward that draws random numbers itself
    (vmap would refuse them, and they would not be the serial draws), or one that cannot
    run without real data."""
    rows = min(params.batch_size, len(data.train_y))
    if rows == 0:
        return None
    try:
        _, random_ops = _meta_findings(model, task, data.train_x[:rows], data.train_y[:rows])
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as error:
        first_line = (str(error).splitlines() or [""])[0]
        return Refusal(
            "its forward cannot run on the meta device", f"{type(error).__name__}: {first_line}"
        )
    if random_ops:
        return Refusal(
            "its forward draws random numbers outside nn.Dropout",
            ", ".join(sorted(set(random_ops))),
        )
    return None


def _layout(model: nn.Module) -> tuple:
    """Its state's names, shapes, dtypes and devices, and its layers' kinds and settings (a
    dropout's p, a BatchNorm's momentum): what must be equal for clients to share a forward."""
    state = tuple((k, tuple(v.shape), v.dtype, v.device) for k, v in model.state_dict().items())
    layers = tuple((name, type(m), m.extra_repr()) for name, m in model.named_modules())
    return state, layers


def _data_layout(x: torch.Tensor, y: torch.Tensor) -> tuple:
    return len(y), len(x), tuple(x.shape[1:]), tuple(y.shape[1:]), x.dtype, y.dtype, x.device


def _optimizer_spec(task: TaskSpec | None, params) -> OptimizerSpec:
    """The optimiser `build_optimizer` would pick for this client."""
    if task is not None and task.optimizer is not None:
        return task.optimizer
    return params_optimizer(params)


def _loss_name(task: TaskSpec | None) -> str:
    return "cross_entropy" if task is None else task.loss


def train_local_models(states: list[State], contexts, params) -> list[LocalRun]:
    """`train_local_model` for several clients: together (torch.func vmap, batched.py) when
    their architecture, sample count and optimiser allow it, else one after the other, with
    a warning that says why (once per federation and reason, not every round). Returns each
    client's `LocalRun`, in the order of `states`."""
    datas = [state.data for state in states]
    models, tasks = [s.model for s in states], [d.task for d in datas]
    refusal = batch_refusal(models, datas, params, tasks) if len(states) > 1 else None
    if len(states) < 2 or refusal is not None:
        if refusal is not None:
            warn_refusal_once(contexts[0].federation, type(models[0]), refusal)
        return [
            train_local_model(state, ctx, params)
            for state, ctx in zip(states, contexts, strict=True)
        ]
    seeds = [derive_seed(ctx.seed, ctx.round, ctx.me, "train") for ctx in contexts]
    xs, ys = [d.train_x for d in datas], [d.train_y for d in datas]
    runs = local_sgd_batched(models, xs, ys, params, seeds, tasks)
    for state, run in zip(states, runs, strict=True):
        state.extras["train_loss"] = run.loss
    return runs


# The refusals already logged, per federation: a FederationInfo is one object per host and
# seed, so the user reads each reason once a run (per host), not in every round's warnings.
_LOGGED: dict[int, set[tuple[str, str]]] = {}


def warn_refusal_once(federation, model_class: type, refusal: Refusal) -> None:
    """Log why clients of `model_class` train one at a time, unless `federation` already
    did for that reason."""
    name = getattr(model_class, "name", model_class.__name__)  # a FedModel's registry name
    if id(federation) not in _LOGGED:
        _LOGGED[id(federation)] = set()
        weakref.finalize(federation, _LOGGED.pop, id(federation), None)
    if (name, refusal.reason) in _LOGGED[id(federation)]:
        return
    _LOGGED[id(federation)].add((name, refusal.reason))
    log.warning(
        "runtime.batch_clients > 1 but clients of model %s train one at a time: %s",
        name,
        refusal,
    )
