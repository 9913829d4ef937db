"""SCAFFOLD with sample-weighted means: a plugin that varies a built-in algorithm.

Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020, Algorithm 1 with option II. raymtl ships it as
the built-in `scaffold` (raymtl/algorithms/scaffold.py; docs/ALGORITHMS.md, SCAFFOLD): the
local steps corrected by control variates, c on the server and c_i on each client, x and c
sent down, y_i and Δc_i up, the refusal of what is not plain SGD. This plugin,
`algorithm.name: scaffold_samples`, keeps all of that and changes one thing, the weights of
the server's two means. With S the sampled clients whose y_i and Δc_i are finite,
Δy_i = y_i − x, n_i client i's training samples, n_S = Σ_{i∈S} n_i and n = Σ_{i=1..N} n_i:

    the paper, built-in `scaffold`:   x ← x + η_g·(1/|S|)·Σ_{i∈S} Δy_i
                                      c ← c + (1/N)·Σ_{i∈S} Δc_i
    this plugin, `scaffold_samples`:  x ← x + η_g·Σ_{i∈S} (n_i/n_S)·Δy_i
                                      c ← c + Σ_{i∈S} (n_i/n)·Δc_i

Why: the paper's means serve its objective, the plain mean (1/N)·Σ_i f_i of the clients'
losses, and keep c = (1/N)·Σ_i c_i. raymtl's FedAvg, as McMahan et al.'s, minimises the
sample-weighted Σ_i (n_i/n)·f_i instead; weighting both means by n_i keeps
c = Σ_i (n_i/n)·c_i, the control variate of that objective, and lets a client with more data
move x more. The two algorithms then compare like for like on skewed data: with η_g = 1,
round 1 (c = c_i = 0) is FedAvg's round bit for bit, where the built-in's is FedAvg's under
`weights: uniform`. With every n_i equal the two weightings are the same means.

How: the built-in takes both means' weights from one method, `mean_weights(federation)`, a
weight w_i for every client (1 each there): x's mean is the aggregation rule's over the y_i
with weights w_i (the default rule: Σ_{i∈S} (w_i/Σ_S w)·y_i), c's sum divides by Σ_i w_i over
all N clients. Overriding it to return the n_i is the whole plugin; its Params, refusals,
round, messages, bits, checkpoints and toolbox (aggregation rules, server optimisers, uplink
compression and attacks) are the built-in's. Name this file in an experiment's `plugins:`
list; it imports nothing but the public `raymtl.extend`.
"""

from __future__ import annotations

from raymtl.extend import FederationInfo, Scaffold, register_algorithm


@register_algorithm
class ScaffoldSamples(Scaffold):
    name = "scaffold_samples"  # beside the built-in `scaffold`, which it does not replace
    summary = "SCAFFOLD with sample-weighted means (plugin; the paper's: built-in scaffold)"

    def mean_weights(self, federation: FederationInfo) -> list[float]:
        """w_i = n_i: x ← x + η_g·Σ (n_i/n_S)·Δy_i and c ← c + Σ (n_i/n)·Δc_i."""
        return [float(samples) for samples in federation.samples]
