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

from raymtl.algorithms.aggregate import by_sender, weighted_average
from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    Message,
    Phase,
    State,
    client_name,
    index_of,
)
from raymtl.algorithms.batched import train_local_models
from raymtl.algorithms.registry import register
from raymtl.algorithms.training import (
    load_received,
    load_tensors,
    model_tensors,
    train_local_model,
)

log = logging.getLogger(__name__)


@register
class FedAvg(Algorithm):
    name = "fedavg"
    summary = "FedAvg: sample-weighted model averaging on a server (McMahan et al. 2017)"
    shapes = ("star",)
    keeps = ()  # the model arrives with each round; evaluation uses the round's broadcast

    def phases(self, round_index, rounds):
        return [
            Phase("server", "broadcast", "all"),
            Phase("client", "train", "sampled", trains=True, batched="train_batch"),
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
        return [Phase("client", "train", "all", trains=True, batched="train_batch")]

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        return state, []

    def train_batch(self, states, inboxes, contexts):
        train_local_models(states, contexts, self.params)
        return [(state, []) for state in states]
