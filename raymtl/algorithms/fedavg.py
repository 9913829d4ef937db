"""FedAvg and Local — the two star-shaped references.

McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017 (docs/ALGORITHMS.md §3, and §4 for Local).

Round t, with S_t the sampled clients (⌈m·N⌉ of N):
    server:          sends w to every i ∈ S_t
    client i ∈ S_t:  w_i ← LocalSGD(w, E epochs, lr)
    server:          w ← Σ_{i∈S_t} n_i·w_i / Σ_{i∈S_t} n_i
Every client is evaluated with the new w (an evaluation_only copy: not traffic).
Bits per round: downlink |S_t|·|w|·32, uplink |S_t|·|w|·32. A client keeps nothing between
rounds (`keeps = ()`): the model it trains arrives with the round, so a host holds no model
per client, whatever N.

Local: every client trains on its own data only; nothing is transmitted.
"""

from __future__ import annotations

import logging
import weakref

from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    Message,
    Phase,
    State,
    client_name,
    index_of,
)
from raymtl.algorithms.batched import Refusal, batch_refusal, local_sgd_batched
from raymtl.algorithms.registry import register
from raymtl.algorithms.training import (
    derive_seed,
    load_received,
    load_tensors,
    local_sgd,
    model_tensors,
    weighted_average,
)

log = logging.getLogger(__name__)


def train_local_model(state: State, ctx, params) -> float:
    """One round of plain local SGD on the client's own data (shared by algorithms)."""
    data = state.data
    seed = derive_seed(ctx.seed, ctx.round, ctx.me, "train")
    # The client's task decides its loss and optimiser (None: cross-entropy, the params' SGD).
    loss = local_sgd(state.model, data.train_x, data.train_y, params, seed, task=data.task)
    state.extras["train_loss"] = loss
    return loss


def train_local_models(states: list[State], contexts, params) -> None:
    """`train_local_model` for several clients: together (torch.func vmap, batched.py) when
    their architecture, sample count and optimiser allow it, else one after the other, with
    a warning that says why (once per federation and reason, not every round)."""
    datas = [state.data for state in states]
    models, tasks = [s.model for s in states], [d.task for d in datas]
    refusal = batch_refusal(models, datas, params, tasks) if len(states) > 1 else None
    if len(states) < 2 or refusal is not None:
        if refusal is not None:
            warn_refusal_once(contexts[0].federation, type(models[0]), refusal)
        for state, ctx in zip(states, contexts, strict=True):
            train_local_model(state, ctx, params)
        return
    seeds = [derive_seed(ctx.seed, ctx.round, ctx.me, "train") for ctx in contexts]
    xs, ys = [d.train_x for d in datas], [d.train_y for d in datas]
    losses = local_sgd_batched(models, xs, ys, params, seeds, tasks)
    for state, loss in zip(states, losses, strict=True):
        state.extras["train_loss"] = loss


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


def by_sender(inbox: list[Message]) -> list[Message]:
    """Messages in a fixed order (by sender), so sums are order independent."""
    return sorted(inbox, key=lambda message: (message.src, message.kind))


@register
class FedAvg(Algorithm):
    name = "fedavg"
    summary = "FedAvg: sample-weighted model averaging on a server (McMahan et al. 2017)"
    shapes = ("star",)
    keeps = ()  # the model arrives with each round; evaluation uses the round's broadcast

    def phases(self, round_index, rounds):
        return [
            Phase("server", "broadcast", "all"),
            Phase("client", "train", "sampled"),
            Phase("server", "aggregate", "inbox"),
        ]

    def init_state(self, participant, data, federation):
        if participant == SERVER:
            return State(model=self.model_factory(SERVER, federation.num_classes[0]))
        return super().init_state(participant, data, federation)

    def broadcast(self, state, inbox, ctx):
        global_model = model_tensors(state.model)  # one payload, stored once for all
        return state, [
            Message(SERVER, client_name(i), "global_model", global_model) for i in ctx.sampled
        ]

    def train(self, state, inbox, ctx):
        load_received(state.model, inbox)  # keeps nothing: the round starts from the global w
        train_local_model(state, ctx, self.params)
        return state, [Message(ctx.me, SERVER, "model", model_tensors(state.model))]

    def train_batch(self, states, inboxes, contexts):
        """`train` for clients trained together (runtime.batch_clients): the same maths."""
        for state, inbox in zip(states, inboxes, strict=True):
            load_received(state.model, inbox)
        train_local_models(states, contexts, self.params)
        return [
            (state, [Message(ctx.me, SERVER, "model", model_tensors(state.model))])
            for state, ctx in zip(states, contexts, strict=True)
        ]

    def aggregate(self, state, inbox, ctx):
        samples = ctx.federation.samples
        updates = [(m.tensors, samples[index_of(m.src)]) for m in by_sender(inbox)]
        average = weighted_average(updates)
        if average is not None:  # None: every update was non-finite (w stays)
            self.merge(state, average)
        global_model = model_tensors(state.model)
        everyone = range(ctx.federation.num_clients)  # evaluation_only: not traffic
        return state, [
            Message(SERVER, client_name(i), "global_model", global_model, True) for i in everyone
        ]

    def merge(self, state: State, average: dict) -> None:
        """How the server takes the clients' sample-weighted average into its `state`
        (FedAvg: the model is replaced by it). A server-side optimiser overrides this alone
        (pFedMe's β-mix; a plugin's server momentum keeps its velocity in `state.extras`)."""
        load_tensors(state.model, average)


@register
class Local(Algorithm):
    name = "local"
    summary = "Local: every client trains alone on its own data (no communication)"
    shapes = ("none", "star", "groups", "peer")  # it ignores the topology: compare on any
    task_support = "different"
    model_support = "different"

    def phases(self, round_index, rounds):
        return [Phase("client", "train", "all")]

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        return state, []

    def train_batch(self, states, inboxes, contexts):
        train_local_models(states, contexts, self.params)
        return [(state, []) for state in states]
