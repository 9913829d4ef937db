"""FedAvg and Local — the two star-shaped references.

McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017 (docs/ALGORITHMS.md §3, and §4 for Local).

Round t, with S_t the sampled clients (⌈m·N⌉ of N):
    server:          sends w to every i ∈ S_t
    client i ∈ S_t:  w_i ← LocalSGD(w, E epochs, lr)
    server:          w ← Σ_{i∈S_t} n_i·w_i / Σ_{i∈S_t} n_i
(the experiment's `aggregation`, `server_optimizer` and central `privacy` replace this mean:
aggregate.combine and aggregate.server_update, docs/ALGORITHMS.md §9)
Every client is evaluated with the new w (one evaluation_only copy to EVERY_CLIENT: not traffic).
Bits per round: downlink |S_t|·|w|·32, uplink |S_t|·|w|·32. A client keeps nothing between
rounds (`keeps = ()`): the model it trains arrives with the round, so a host holds no model
per client, whatever N.

`local_layers` (WholeModelParams, local_layers.py): the tensors it names never travel, either
way; every client keeps its model between rounds (`keeps` then holds "model", per instance),
loads only the shared tensors it receives and is evaluated with the new shared w over its own
local layers. `epochs_max`: each sampled client draws its epochs E_k from {E, …, E_max}
(seeded per round and client); such clients train one by one, never batched.

Local: every client trains on its own data only; nothing is transmitted.
"""

from __future__ import annotations

from raymtl.algorithms.aggregate import by_sender, combine, server_update
from raymtl.algorithms.base import (
    EVERY_CLIENT,
    SERVER,
    Algorithm,
    Message,
    Phase,
    State,
    client_name,
    index_of,
)
from raymtl.algorithms.batched import train_local_models
from raymtl.algorithms.local_layers import (
    WholeModelParams,
    check_local_layers,
    local_names,
    round_params,
    shared_tensors,
)
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import (
    load_received,
    load_tensors,
    model_tensors,
    train_local_model,
)


@register_algorithm
class FedAvg(Algorithm):
    name = "fedavg"
    summary = "FedAvg: sample-weighted model averaging on a server (McMahan et al. 2017)"
    Params = WholeModelParams
    shapes = ("star",)
    keeps = ()  # the model arrives with each round; evaluation uses the round's broadcast
    toolbox = ("aggregation", "server_optimizer", "privacy", "uplink")

    def __init__(self, params, model_factory):
        super().__init__(params, model_factory)
        # A subclass whose Params has no `local_layers` (Per-FedAvg, FedRep) ships whole models.
        self.local_layers = getattr(params, "local_layers", None)
        if self.local_layers is not None:  # the local layers live only in the client's model
            self.keeps = tuple(dict.fromkeys(("model", *type(self).keeps)))

    def batched_step(self, phase):
        # Clients trained together share one schedule: with epochs drawn per client they
        # train one by one (the same maths).
        if getattr(self.params, "epochs_max", None) is not None:
            return None
        return super().batched_step(phase)

    def shared(self, model) -> dict:
        """What of `model` travels: its floating-point tensors but the local layers."""
        if self.local_layers is None:
            return model_tensors(model)
        return shared_tensors(model, local_names(model, self.local_layers))

    def local_params(self, ctx):
        """The local-training settings of this client this round: `self.params` with its
        drawn epochs E_k under `epochs_max` (local_layers.round_params)."""
        return round_params(self.params, ctx)

    def phases(self, round_index, rounds):
        return [
            Phase("server", "broadcast", "all"),
            Phase("client", "train", "sampled", trains=True, batched="train_batch"),
            Phase("server", "aggregate", "inbox"),
        ]

    def init_state(self, participant, data, federation):
        if participant == SERVER:
            state = State(model=self.model_factory(SERVER, federation.num_classes[0]))
        else:
            state = super().init_state(participant, data, federation)
        check_local_layers(state.model, self.local_layers, participant)
        return state

    def broadcast(self, state, inbox, ctx):
        global_model = self.shared(state.model)  # one payload, stored once for all
        return state, [
            Message(SERVER, client_name(i), "global_model", global_model) for i in ctx.sampled
        ]

    def train(self, state, inbox, ctx):
        # The round starts from the global w (over the client's own local layers, if any).
        load_received(state.model, inbox)
        train_local_model(state, ctx, self.local_params(ctx))
        return state, [Message(ctx.me, SERVER, "model", self.shared(state.model))]

    def train_batch(self, states, inboxes, contexts):
        """`train` for clients trained together (runtime.batch_clients): the same maths."""
        for state, inbox in zip(states, inboxes, strict=True):
            load_received(state.model, inbox)
        train_local_models(states, contexts, self.params)
        return [
            (state, [Message(ctx.me, SERVER, "model", self.shared(state.model))])
            for state, ctx in zip(states, contexts, strict=True)
        ]

    def aggregate(self, state, inbox, ctx):
        samples = ctx.federation.samples
        updates = [(m.tensors, samples[index_of(m.src)]) for m in by_sender(inbox)]
        return self.take(state, updates, ctx)

    def take(self, state: State, updates: list, ctx, reference: dict | None = None):
        """Combine `updates` [(w_k, weight)] into the server's model — the experiment's rule
        and central DP (`combine`), its server optimiser (`server_update`), then `merge` —
        and send every client its evaluation copy. `reference`: w_t, when the caller has it."""
        if reference is None:
            reference = self.shared(state.model)  # w_t: what the sampled clients started from
        average = combine(updates, ctx, state, reference=reference)
        if average is not None:  # None: every update was non-finite (w stays)
            self.merge(state, server_update(state, reference, average, ctx))
        global_model = self.shared(state.model)  # every client's evaluation copy, sent once
        return state, [Message(SERVER, EVERY_CLIENT, "global_model", global_model, True)]

    def merge(self, state: State, average: dict) -> None:
        """How the server takes the clients' sample-weighted average into its `state`
        (FedAvg: the model is replaced by it). A server-side optimiser overrides this alone
        (pFedMe's β-mix; a plugin's server momentum keeps its velocity in `state.extras`)."""
        load_tensors(state.model, average)


@register_algorithm
class Local(Algorithm):
    name = "local"
    combines_otherwise = "every client trains alone: nothing is combined"
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
