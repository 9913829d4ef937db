"""FedRep — a shared representation (the body), a personal head per client.

Collins, Hassani, Mokhtari and Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021 (docs/ALGORITHMS.md, FedRep).

The model is split by parameter name: the body φ (`backbone.`) is shared, the head h_k
(`head.`) is client k's own and never leaves it. Round t, S_t the sampled clients (⌈m·N⌉):
    server:          sends φ to every k ∈ S_t
    client k ∈ S_t:  φ_k ← φ;
                     h_k ← LocalSGD_h(h_k; φ_k fixed, τ_h epochs, η)         (head_epochs)
                     φ_k ← LocalSGD_φ(φ_k; h_k fixed, τ_φ epochs, η)         (epochs)
                     sends φ_k to the server
    server:          φ ← Σ_{k∈S_t} n_k·φ_k / Σ_{k∈S_t} n_k
Every client is then evaluated with its own head and the new φ (an evaluation_only copy of φ
to every client: not traffic). A client keeps its model between rounds (`keeps = ("model",)`):
its head persists; the body it holds is replaced by the one that arrives when it trains.

Only the body travels, so clients of different tasks (heads, losses, optimisers) take part
together (`task_support = "different"`); the bodies are averaged by name and shape, so every
client trains one architecture (`model_support = "same"`). Float buffers of the body (batch
norm statistics) travel and are averaged with it; during the head epochs they follow the
model's train mode, as in the paper's code, where only the gradients are switched off.
Bits per round: downlink |S_t|·|φ|·32, uplink |S_t|·|φ|·32 (|φ|: the body's floats).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import Field
from torch import nn

from raymtl.algorithms.aggregate import by_sender, combine, server_update
from raymtl.algorithms.base import (
    EVERY_CLIENT,
    SERVER,
    LocalTrainingParams,
    Message,
    client_name,
    index_of,
)
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import derive_seed, load_received, local_sgd, model_tensors

BODY, HEAD = "backbone.", "head."


class FedRepParams(LocalTrainingParams):
    """The paper's experimental setting: 10 head epochs, 1 body epoch, SGD lr 0.01, batches of 10,
    10% of the clients a round."""

    epochs: int = Field(1, ge=1, description="body epochs τ_φ per round (head fixed)")
    head_epochs: int = Field(10, ge=1, description="head epochs τ_h per round (body fixed)")
    lr: float = Field(0.01, gt=0, description="local SGD learning rate η (head and body)")
    batch_size: int = Field(10, ge=1, description="local mini-batch size")
    sample_fraction: float = Field(
        0.1, gt=0, le=1, description="fraction m of clients sampled per round"
    )


def require_split(model: nn.Module, participant: str) -> None:
    """Refuse (one line) a model without both a `backbone.` body and a `head.` head."""
    names = list(model.state_dict())
    missing = [p for p in (BODY, HEAD) if not any(n.startswith(p) for n in names)]
    if missing:
        raise ValueError(
            f"model: fedrep needs a body/head split ('backbone.*' and 'head.*' parameters); "
            f"the model of {participant} ({type(model).__name__}) has no "
            f"{' and no '.join(repr(p + '*') for p in missing)}"
        )


@contextmanager
def trainable_only(model: nn.Module, prefix: str) -> Iterator[None]:
    """Within the block, only the parameters named `prefix`... get gradients; restored after
    (the model may be a host's working model, shared by clients)."""
    before = {name: p.requires_grad for name, p in model.named_parameters()}
    try:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith(prefix))
        yield
    finally:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(before[name])


def fedrep_train(model: nn.Module, data, params: FedRepParams, seed: int) -> tuple[float, float]:
    """The client update in place: τ_h head epochs (body fixed), then τ_φ body epochs (head
    fixed); returns the mean batch loss of each phase. Each phase has its own seeded batch
    order and a fresh optimiser (the task's, else SGD with the params' settings)."""
    losses = []
    for prefix, epochs, purpose in (
        (HEAD, params.head_epochs, "head"),
        (BODY, params.epochs, "body"),
    ):
        phase = params.model_copy(update={"epochs": epochs})
        with trainable_only(model, prefix):
            losses.append(
                local_sgd(
                    model,
                    data.train_x,
                    data.train_y,
                    phase,
                    derive_seed(seed, purpose),
                    task=data.task,
                ).loss
            )
    return losses[0], losses[1]


@register_algorithm
class FedRep(FedAvg):
    """FedAvg's round (broadcast → train → aggregate) over the body only."""

    name = "fedrep"
    summary = "FedRep: shared body averaged, personal heads trained first (Collins et al. 2021)"
    Params = FedRepParams
    shapes = ("star",)
    task_support = "different"  # only the body travels: heads, losses, optimisers may differ
    model_support = "same"  # bodies are averaged by name and shape
    keeps = ("model",)  # the personal head h_k (the body is replaced when the client trains)
    uplink_kinds = ("body",)

    def init_state(self, participant, data, federation):
        state = super().init_state(participant, data, federation)
        require_split(state.model, participant)
        return state

    def broadcast(self, state, inbox, ctx):
        body = model_tensors(state.model, [BODY])  # one payload, stored once for all
        return state, [Message(SERVER, client_name(i), "body", body) for i in ctx.sampled]

    def train(self, state, inbox, ctx):
        load_received(state.model, inbox)  # φ_k ← φ; the head h_k is the client's own
        seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
        head_loss, body_loss = fedrep_train(state.model, state.data, self.params, seed)
        state.extras.update(train_loss=body_loss, head_loss=head_loss)
        return state, [Message(ctx.me, SERVER, "body", model_tensors(state.model, [BODY]))]

    def aggregate(self, state, inbox, ctx):
        samples = ctx.federation.samples
        body = model_tensors(state.model, [BODY])  # φ_t: what the clients started from
        updates = [(m.tensors, samples[index_of(m.src)]) for m in by_sender(inbox)]
        average = combine(updates, ctx, state, reference=body)
        if average is not None:  # None: every update was non-finite (φ stays)
            # FedAvg's hook: loads the named (body) entries
            self.merge(state, server_update(state, body, average, ctx))
        body = model_tensors(state.model, [BODY])  # every client's evaluation copy, sent once
        return state, [Message(SERVER, EVERY_CLIENT, "body", body, True)]
