"""FedBN — FedAvg with every batch-norm layer kept on its client.

Li, Jiang, Zhang, Kamp and Dou, "FedBN: Federated Learning on Non-IID Features via Local
Batch Normalization", ICLR 2021 (docs/ALGORITHMS.md, FedBN).

With L the batch-norm tensors of the model (each BN layer's weight γ, bias β, running mean,
running variance and counter) and G the others, round t, S_t the sampled clients:
    server:          sends w_G to every k ∈ S_t                      (never any of L)
    client k ∈ S_t:  w_k ← (w_G, L_k);  w_k ← LocalSGD(w_k, E, η)
                     sends its G part w_{k,G}                          (L_k stays)
    server:          w_G ← Σ_{k∈S_t} n_k·w_{k,G} / Σ_{k∈S_t} n_k
Every client is evaluated with the new w_G over its own L_k (before it first trains: over
the initial L). So each client normalises features with its own statistics and affine
parameters: the paper's remedy for feature shift (scanners, domains) between clients.

This is FedAvg with `local_layers: batchnorm` (local_layers.py): the experiment's
aggregation rule, server optimiser, central DP and uplink compression act on w_G. The
generalisation `local_layers: [prefixes]` keeps any named layers instead; null would be
FedAvg, and is refused. A model without batch norm is refused when FedBN starts.
Bits per round: (|S_t|·|w_G|·32, |S_t|·|w_G|·32). A client keeps its model between rounds
(`keeps = ("model",)`): its L_k persists.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.local_layers import BATCHNORM, WholeModelParams
from raymtl.algorithms.registry import register_algorithm


class FedBNParams(WholeModelParams):
    local_layers: tuple[str, ...] | Literal["batchnorm"] | None = Field(
        BATCHNORM,
        description="what stays on each client: 'batchnorm' (the paper's) or "
        "parameter-name prefixes",
    )

    @model_validator(mode="after")
    def _something_stays(self) -> FedBNParams:
        if self.local_layers is None:
            raise ValueError(
                "local_layers: FedBN keeps layers on the clients; null is FedAvg (use "
                "algorithm fedavg, or local_layers: batchnorm)"
            )
        return self


@register_algorithm
class FedBN(FedAvg):
    """FedAvg's round with the batch-norm layers (`local_layers`) kept by the clients."""

    name = "fedbn"
    summary = "FedBN: FedAvg with every batch-norm layer kept on its client (Li et al. 2021)"
    Params = FedBNParams
    shapes = ("star",)
    keeps = ("model",)  # L_k (FedAvg's __init__ adds it too, whenever local_layers is set)
