"""SCAFFOLD — local steps corrected by control variates (option II), the paper's plain means.

Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020, Algorithm 1 with option II (docs/ALGORITHMS.md,
SCAFFOLD).

x the server's model, c its control variate, c_k client k's (c = c_k = 0 before round 1),
η_l the local learning rate (`lr`), η_g the server's (`server_lr`), K_k the local steps
client k ran (E·⌈n_k/B⌉). Round t, S_t the sampled clients (m_t of N):
    server:          sends x and c to every k ∈ S_t                (kinds "global_model", "control")
    client k ∈ S_t:  y_k ← x;  K_k times: y_k ← y_k − η_l·(g_k(y_k) − c_k + c)
                     c_k⁺ = c_k − c + (x − y_k)/(K_k·η_l)            (option II)
                     sends y_k and Δc_k = c_k⁺ − c_k;  c_k ← c_k⁺    (kinds "model", "control")
    server:          x ← x + η_g·(1/m_t)·Σ_{k∈S_t} (y_k − x)
                     c ← c + (1/N)·Σ_{k∈S_t} Δc_k
The means are the paper's plain ones, not weighted by samples. Both take their weights from
one hook, `mean_weights` (w_k = 1 here: x's mean divides by Σ_{k∈S_t} w_k = m_t, c's sum by
Σ_k w_k = N), which a variant overrides: the plugin example examples/scaffold registers
`scaffold_samples`, the sample-weighted variant, by that alone.

Composition with the toolbox (docs/ALGORITHMS.md §9): the y_k go through the experiment's
aggregation rule (`combine`) with the w_k (equal), so the default rule is the plain mean above
and another rule (median, trimmed mean, Krum) replaces it; then x + η_g·(combined − x) goes
to the server optimiser, which steps on η_g·Δ_t. With η_g = 1, round 1 (c = c_k = 0) is
FedAvg's round under `weights: uniform` (bit for bit FedAvg's when every n_k is equal).
Only y_k is the uplink that compression and attacks act on; Δc_k travels as is and is summed
plainly. Central DP is not offered: Δc_k = −c + (x − y_k)/(K_k·η_l) is the client's update
itself, sent un-noised, so noise on y_k alone would protect nothing.

The correction is applied by plain SGD through `local_sgd`'s loss hook (⟨y, c − c_k⟩ added to
the task loss); option II's identity holds for plain SGD steps only, so `momentum`,
`clip_grad` and a task optimiser other than plain SGD are refused. Weight decay is part of
g_k. c and c_k cover the model's parameters (float buffers travel with the model as in
FedAvg). Bits per round: FedAvg's twice over for a model without float buffers. The server
keeps c, every client its c_k (`keeps = ("extras",)`), in checkpoints too.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator
from torch import nn

from raymtl.algorithms.aggregate import by_sender, combine, is_finite, server_update
from raymtl.algorithms.base import (
    EVERY_CLIENT,
    SERVER,
    Algorithm,
    FederationInfo,
    LocalTrainingParams,
    Message,
    Phase,
    State,
    StepContext,
    client_name,
    index_of,
)
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import (
    LocalRun,
    LossHook,
    derive_seed,
    load_received,
    load_tensors,
    local_sgd,
    model_tensors,
)
from raymtl.tasks.objectives import task_loss
from raymtl.tasks.spec import TaskSpec

Tensors = dict[str, torch.Tensor]


class ScaffoldParams(LocalTrainingParams):
    """Local training by plain SGD, plus the server's learning rate."""

    server_lr: float = Field(1.0, gt=0, le=10, description="server learning rate η_g")

    @model_validator(mode="after")
    def _plain_sgd(self) -> ScaffoldParams:
        if self.momentum:
            raise ValueError("momentum: SCAFFOLD's correction needs plain SGD steps (use 0)")
        if self.clip_grad is not None:
            raise ValueError("clip_grad: SCAFFOLD's correction needs plain SGD steps (use null)")
        return self


def zero_control(model: nn.Module) -> Tensors:
    """A control variate of zeros: one CPU tensor per parameter of `model`."""
    return {name: torch.zeros_like(p, device="cpu") for name, p in model.named_parameters()}


def client_control_update(
    control_k: Tensors, control: Tensors, x: Tensors, y: Tensors, steps: int, lr: float
) -> tuple[Tensors, Tensors]:
    """Option II: (c_k⁺, Δc_k), c_k⁺ = c_k − c + (x − y_k)/(K_k·η_l), Δc_k = c_k⁺ − c_k.
    K_k = 0 (a client without training samples) leaves c_k as it is (Δc_k = 0)."""
    if steps == 0:
        return dict(control_k), {name: torch.zeros_like(c) for name, c in control_k.items()}
    new_control, delta = {}, {}
    for name, c_k in control_k.items():
        new_control[name] = c_k - control[name] + (x[name] - y[name]) / (steps * lr)
        delta[name] = new_control[name] - c_k
    return new_control, delta


def corrected_loss(
    task: TaskSpec | None, correction: Tensors, task_losses: list[torch.Tensor]
) -> LossHook:
    """The local step's loss: the task's plus ⟨y, c − c_k⟩, whose gradient is c − c_k
    (`correction`, on the model's device), so SGD steps by g_k − c_k + c. Each step's task
    loss (without the linear term) is appended to `task_losses`."""

    def loss_fn(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = task_loss(task, net(x), y)
        task_losses.append(loss.detach())
        drift = [(p * correction[name]).sum() for name, p in net.named_parameters()]
        return loss + torch.stack(drift).sum()

    return loss_fn


def corrected_sgd(
    model: nn.Module, data, params: ScaffoldParams, seed: int, correction: Tensors
) -> LocalRun:
    """`local_sgd` on the client's data with c − c_k added to every step's gradient, in
    place; returns the mean task loss and the steps K_k."""
    device = next(model.parameters()).device
    shift = {name: value.to(device) for name, value in correction.items()}
    task_losses: list[torch.Tensor] = []
    hook = corrected_loss(data.task, shift, task_losses)
    run = local_sgd(model, data.train_x, data.train_y, params, seed, loss_fn=hook, task=data.task)
    mean = float(torch.stack(task_losses).mean()) if task_losses else float("nan")
    return LocalRun(mean, run.steps)


def server_model(x: Tensors, combined: Tensors, server_lr: float) -> Tensors:
    """x + η_g·(combined − x); `combined` itself when η_g = 1 (FedAvg's mean, bit for bit)."""
    if server_lr == 1:
        return combined
    return {name: value + server_lr * (combined[name] - value) for name, value in x.items()}


def server_control(
    control: Tensors, deltas: list[Tensors], total: float, weights: list[float] | None = None
) -> Tensors:
    """c + (Σ_k w_k·Δc_k)/`total`, summed in the order given: c + (1/N)·Σ_k Δc_k with
    w_k = 1 (no `weights`) and total = N."""
    if not deltas:
        return control
    weights = [1.0] * len(deltas) if weights is None else weights
    pairs = list(zip(deltas, weights, strict=True))
    return {
        name: value + sum(delta[name] * weight for delta, weight in pairs) / total
        for name, value in control.items()
    }


@register_algorithm
class Scaffold(Algorithm):
    name = "scaffold"
    summary = "SCAFFOLD: local steps corrected by control variates (Karimireddy et al. 2020)"
    Params = ScaffoldParams
    shapes = ("star",)
    keeps = ("extras",)  # c_k persists between rounds; the model arrives with each round
    # No "privacy": Δc_k, which travels un-noised, reveals the update (module docstring).
    toolbox = ("aggregation", "server_optimizer", "uplink")
    toolbox_refusals = {
        "privacy": "its control variates Δc_k travel un-noised beside the model: they leak it"
    }
    uplink_kinds = ("model",)  # y_k; Δc_k ("control") travels as is

    def phases(self, round_index: int, rounds: int) -> list[Phase]:
        return [
            Phase("server", "broadcast", "all"),
            Phase("client", "train", "sampled", trains=True),
            Phase("server", "aggregate", "inbox"),
        ]

    def init_state(self, participant: str, data, federation: FederationInfo) -> State:
        if participant == SERVER:  # x, from the seeded factory as FedAvg's; c = 0 until used
            return State(model=self.model_factory(SERVER, federation.num_classes[0]))
        return super().init_state(participant, data, federation)

    def check_resources(self, federation: FederationInfo, memory_budget: float) -> None:
        """Refuse a task whose own optimiser is not plain SGD (option II needs plain steps)."""
        for task in federation.task_specs:
            optimizer = task.optimizer
            if optimizer is None or (optimizer.name == "sgd" and not optimizer.momentum):
                continue
            used = optimizer.name
            if optimizer.name == "sgd":
                used = f"sgd with momentum {optimizer.momentum}"
            raise ValueError(
                f"data.tasks: task '{task.name}' trains with {used}; SCAFFOLD's correction "
                "needs plain SGD steps (optimizer: null, or sgd with momentum 0)"
            )

    def broadcast(self, state: State, inbox: list[Message], ctx: StepContext):
        x = model_tensors(state.model)  # one payload of each kind, stored once for all
        control = state.extras.setdefault("control", zero_control(state.model))
        outbox = []
        for i in ctx.sampled:
            outbox.append(Message(SERVER, client_name(i), "global_model", x))
            outbox.append(Message(SERVER, client_name(i), "control", control))
        return state, outbox

    def train(self, state: State, inbox: list[Message], ctx: StepContext):
        # y_k ← x. Only the model's kind: c has the parameters' names and must not load.
        load_received(state.model, inbox, kinds=("global_model",))
        (control,) = [m.tensors for m in inbox if m.kind == "control"]
        control_k = state.extras.get("control") or zero_control(state.model)
        x = model_tensors(state.model)
        correction = {name: control[name] - c_k for name, c_k in control_k.items()}
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")  # FedAvg's draws
        run = corrected_sgd(state.model, state.data, self.params, seed, correction)
        state.extras["train_loss"] = run.loss
        y = model_tensors(state.model)
        control_k, delta = client_control_update(
            control_k, control, x, y, run.steps, self.params.lr
        )
        state.extras["control"] = control_k  # kept to the next round this client trains in
        return state, [
            Message(ctx.me, SERVER, "model", y),
            Message(ctx.me, SERVER, "control", delta),
        ]

    def mean_weights(self, federation: FederationInfo) -> list[float]:
        """w_k for every client k of the federation, the weights of the server's two means
        over S_t (its clients whose y_k and Δc_k are finite): x ← x + η_g·Σ_{S_t} (w_k/Σ_{S_t}
        w)·(y_k − x) (through the aggregation rule) and c ← c + Σ_{S_t} (w_k/Σ_all w)·Δc_k.
        1 each: the paper's 1/m_t and 1/N. A hook for variants (examples/scaffold: n_k)."""
        return [1.0] * federation.num_clients

    def aggregate(self, state: State, inbox: list[Message], ctx: StepContext):
        received: dict[str, dict[str, Tensors]] = {}
        for message in by_sender(inbox):  # sorted by sender: the sums' order is fixed
            received.setdefault(message.src, {})[message.kind] = message.tensors
        weights = self.mean_weights(ctx.federation)
        usable = [  # a client whose y_k or Δc_k is not finite is left out of both
            (kinds["model"], kinds["control"], weights[index_of(src)])
            for src, kinds in received.items()
            if "model" in kinds
            and "control" in kinds
            and is_finite(kinds["model"])
            and is_finite(kinds["control"])
        ]
        x = model_tensors(state.model)
        control = state.extras.setdefault("control", zero_control(state.model))
        # The w_k (1 each here): the default rule takes the paper's plain mean of the y_k.
        combined = combine([(y, w) for y, _, w in usable], ctx, state, reference=x)
        if combined is not None:
            stepped = server_model(x, combined, self.params.server_lr)
            load_tensors(state.model, server_update(state, x, stepped, ctx))
            deltas, used = [dc for _, dc, _ in usable], [w for _, _, w in usable]
            state.extras["control"] = server_control(control, deltas, sum(weights), used)
        x = model_tensors(state.model)  # every client's evaluation copy, sent once
        return state, [Message(SERVER, EVERY_CLIENT, "global_model", x, True)]
