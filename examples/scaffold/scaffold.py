"""SCAFFOLD with sample-weighted means: client drift corrected by control variates
(Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020), with option II of the paper for the clients'
control variates.

A raymtl plugin: name this file in an experiment's `plugins:` list and use
`algorithm.name: scaffold_samples`. It imports nothing but the public `raymtl.extend`.
raymtl ships the paper's SCAFFOLD as the built-in `scaffold` (plain means); this plugin is
the variant that weights its means by the clients' samples, as FedAvg does: it shows how a
plugin varies a built-in's weighting. Where FedAvgM (examples/fedavgm) changes only the
server, SCAFFOLD changes the clients' local step and sends a second tensor with every model:
docs/EXTENDING.md, section 10, walks through it.

Round t, with S the sampled clients, x the server's model, c its control variate, c_i
client i's (c and every c_i are zero before round 1), η_l the local learning rate (`lr`) and
K = E·⌈n_i/B⌉ client i's local steps:
    server:          sends x and c to every i ∈ S           (kinds "global_model", "control")
    client i ∈ S:    y_i ← x;  K times: y_i ← y_i − η_l·(g_i(y_i) − c_i + c)
                     c_i⁺ = c_i − c + (x − y_i)/(K·η_l)      (option II)
                     Δy_i = y_i − x;  Δc_i = c_i⁺ − c_i;  c_i ← c_i⁺
                     sends y_i and Δc_i                      (kinds "model", "control")
    server:          x ← x + η_g·mean(Δy_i)
                     c ← c + (|S|/N)·mean(Δc_i)
g_i is a mini-batch gradient of client i's task loss; η_g is `server_lr` (default 1).

The means are weighted by the clients' training samples n_i, as raymtl's FedAvg weights its
average: x ← x + η_g·Σ_{i∈S} (n_i/n_S)·Δy_i with n_S = Σ_{i∈S} n_i, and
c ← c + Σ_{i∈S} (n_i/n)·Δc_i with n = Σ_{i=1..N} n_i, which keeps c = Σ_i (n_i/n)·c_i, the
control variate of the sample-weighted objective. With every n_i equal they are the paper's
plain means above, which the built-in `scaffold` takes whatever the n_i. A client sends y_i
itself rather than Δy_i (as many bits; the server holds x), and the server computes
x + η_g·Σ (n_i/n_S)·(y_i − x) as (1 − η_g)·x + η_g·Σ (n_i/n_S)·y_i, so that with η_g = 1 it
takes FedAvg's average bit for bit: round 1 (c = c_i = 0) is then FedAvg's round 1 exactly.
A client whose y_i or Δc_i is not finite is left out of both sums.

The correction is applied by plain SGD: the local step adds ⟨y, c − c_i⟩ to the task loss
through `local_sgd`'s loss hook, so each step's gradient is g_i − c_i + c. Option II's
identity (x − y_i)/(K·η_l) = mean_k(g_i) − c_i + c holds only for plain SGD steps, so
`momentum` and `clip_grad` are refused, and so is a task that names an optimiser other than
SGD without momentum. Weight decay is allowed: it is the gradient of (λ/2)·‖y‖², part of g_i.
c and c_i cover the model's parameters (its float buffers, if any, travel with y_i and x as in
FedAvg). Bits per round: FedAvg's twice over (x and c down, y_i and Δc_i up, for a model
without float buffers). The server keeps c in its `State.extras`, every client its c_i in its
own (`keeps = ("extras",)`; the model arrives with each round), so checkpoints hold them and
`--resume` continues with them.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator
from torch import nn

from raymtl.extend import (
    SERVER,
    Algorithm,
    ClientData,
    FederationInfo,
    LocalTrainingParams,
    LossHook,
    Message,
    Phase,
    State,
    StepContext,
    TaskSpec,
    by_sender,
    client_name,
    derive_seed,
    index_of,
    is_finite,
    load_received,
    load_tensors,
    local_sgd,
    model_tensors,
    register_algorithm,
    task_loss,
    weighted_average,
)

Tensors = dict[str, torch.Tensor]


class ScaffoldParams(LocalTrainingParams):
    """FedAvg's local training, by plain SGD, plus the server's learning rate."""

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
    control_i: Tensors, control: Tensors, x: Tensors, y: Tensors, steps: int, lr: float
) -> tuple[Tensors, Tensors]:
    """Option II: (c_i⁺, Δc_i) with c_i⁺ = c_i − c + (x − y)/(K·η_l) and Δc_i = c_i⁺ − c_i.

    K = 0 steps (a client without training samples) leaves c_i as it is (Δc_i = 0).
    """
    if steps == 0:
        return dict(control_i), {name: torch.zeros_like(c) for name, c in control_i.items()}
    new_control, delta = {}, {}
    for name, c_i in control_i.items():
        new_control[name] = c_i - control[name] + (x[name] - y[name]) / (steps * lr)
        delta[name] = new_control[name] - c_i
    return new_control, delta


def server_update(
    x: Tensors,
    control: Tensors,
    updates: list[tuple[Tensors, Tensors, int]],
    total_samples: int,
    server_lr: float,
) -> tuple[Tensors, Tensors]:
    """(x, c) -> (x', c') from the sampled clients' (y_i, Δc_i, n_i), in the order given:
    x' = (1 − η_g)·x + η_g·Σ (n_i/n_S)·y_i  (= x + η_g·Σ (n_i/n_S)·Δy_i),
    c' = c + Σ (n_i/n)·Δc_i with n = `total_samples`, over the clients whose y_i and Δc_i are
    finite; (x, c) unchanged when none is."""
    usable = [(y, dc, n) for y, dc, n in updates if is_finite(y) and is_finite(dc)]
    average = weighted_average([(y, n) for y, _, n in usable])
    if average is None:
        return x, control
    new_x = {name: (1 - server_lr) * w + server_lr * average[name] for name, w in x.items()}
    new_control = {
        name: c + sum(dc[name] * (n / total_samples) for _, dc, n in usable)
        for name, c in control.items()
    }
    return new_x, new_control


def corrected_loss(
    task: TaskSpec | None, correction: Tensors, task_losses: list[torch.Tensor]
) -> LossHook:
    """The loss hook of the local step: the task's loss plus ⟨y, c − c_i⟩, whose gradient is
    c − c_i (`correction`, on the model's device), so SGD steps by g_i − c_i + c. It appends
    each step's task loss (without the linear term) to `task_losses`."""

    def loss_fn(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = task_loss(task, net(x), y)
        task_losses.append(loss.detach())
        drift = [(p * correction[name]).sum() for name, p in net.named_parameters()]
        return loss + torch.stack(drift).sum()

    return loss_fn


def corrected_sgd(
    model: nn.Module, data: ClientData, params: ScaffoldParams, seed: int, correction: Tensors
) -> tuple[float, int]:
    """`local_sgd` on the client's data with c − c_i (`correction`) added to every step's
    gradient, in place. Returns the mean task loss over the steps run and their number K."""
    device = next(model.parameters()).device
    shift = {name: value.to(device) for name, value in correction.items()}
    task_losses: list[torch.Tensor] = []
    hook = corrected_loss(data.task, shift, task_losses)
    local_sgd(model, data.train_x, data.train_y, params, seed, loss_fn=hook, task=data.task)
    mean = float(torch.stack(task_losses).mean()) if task_losses else float("nan")
    return mean, len(task_losses)


@register_algorithm
class Scaffold(Algorithm):
    name = "scaffold_samples"  # the built-in `scaffold` takes the paper's plain means
    summary = "SCAFFOLD with sample-weighted means (plugin; the paper's: built-in scaffold)"
    Params = ScaffoldParams
    shapes = ("star",)
    keeps = ("extras",)  # c_i persists between rounds; the model arrives with each round

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
        """Refuse a task whose own optimiser is not plain SGD (see the module docstring)."""
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
        # y_i ← x. Only the model's kind: c has the parameters' names and must not load.
        load_received(state.model, inbox, kinds=("global_model",))
        (control,) = [m.tensors for m in inbox if m.kind == "control"]
        control_i = state.extras.get("control") or zero_control(state.model)
        x = model_tensors(state.model)
        correction = {name: control[name] - c_i for name, c_i in control_i.items()}
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")  # FedAvg's draws
        _, steps = corrected_sgd(state.model, state.data, self.params, seed, correction)
        y = model_tensors(state.model)
        control_i, delta = client_control_update(control_i, control, x, y, steps, self.params.lr)
        state.extras["control"] = control_i  # kept to the next round this client trains in
        return state, [
            Message(ctx.me, SERVER, "model", y),
            Message(ctx.me, SERVER, "control", delta),
        ]

    def aggregate(self, state: State, inbox: list[Message], ctx: StepContext):
        samples = ctx.federation.samples
        received: dict[str, dict[str, Tensors]] = {}
        for message in by_sender(inbox):  # sorted by sender: the sums' order is fixed
            received.setdefault(message.src, {})[message.kind] = message.tensors
        updates = [
            (kinds["model"], kinds["control"], samples[index_of(src)])
            for src, kinds in received.items()
        ]
        control = state.extras.setdefault("control", zero_control(state.model))
        x, control = server_update(
            model_tensors(state.model), control, updates, sum(samples), self.params.server_lr
        )
        load_tensors(state.model, x)
        state.extras["control"] = control
        x = model_tensors(state.model)
        everyone = range(ctx.federation.num_clients)  # evaluation_only: not traffic
        return state, [Message(SERVER, client_name(i), "global_model", x, True) for i in everyone]
