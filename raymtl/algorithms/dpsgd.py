"""D-PSGD — decentralized parallel SGD over a peer graph.

Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?",
NeurIPS 2017 (the local-update variant used as the FMTL papers' baseline;
docs/ALGORITHMS.md §5).

Round t, every client i in parallel, W the Metropolis–Hastings weights of the
communication graph (w_ij = 1/(1 + max(deg_i, deg_j)) on edges, w_ii = 1 − Σ_j w_ij):
    w_i^{t+½} ← LocalSGD(w_i^t, E epochs, lr)
    send w_i^{t+½} to every neighbour j ∈ N(i)
    w_i^{t+1} ← Σ_{j ∈ N(i) ∪ {i}} W_ij · w_j^{t+½}
There is no server: models move peer to peer.
"""

from __future__ import annotations

from raymtl.algorithms.aggregate import by_sender, weighted_average
from raymtl.algorithms.base import Algorithm, Message, Phase, client_name, index_of
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import load_tensors, model_tensors, train_local_model


def mix(own: dict, own_weight: float, inbox: list[Message], weights: dict[int, float]):
    """Σ_j W_ij·w_j over self and neighbours (non-finite neighbours are dropped)."""
    updates = [(own, own_weight)]
    updates += [(m.tensors, weights[index_of(m.src)]) for m in by_sender(inbox)]
    return weighted_average(updates)


@register_algorithm
class DPSGD(Algorithm):
    name = "dpsgd"
    combines_otherwise = "each client mixes its neighbours' models by the graph's weights"
    summary = "D-PSGD: local SGD then Metropolis-weighted averaging with graph neighbours"
    shapes = ("peer",)

    def phases(self, round_index, rounds):
        return [Phase("client", "train", "all", trains=True), Phase("client", "combine", "all")]

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        tensors = model_tensors(state.model)
        outbox = [
            Message(ctx.me, client_name(j), "model", tensors)
            for j in ctx.federation.neighbours(ctx.index)
        ]
        return state, outbox

    def combine(self, state, inbox, ctx):
        weights = ctx.federation.mixing[ctx.index]
        mixed = mix(model_tensors(state.model), weights[ctx.index], inbox, weights)
        if mixed is not None:
            load_tensors(state.model, mixed)
        return state, []
