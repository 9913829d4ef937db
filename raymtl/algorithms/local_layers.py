"""What of a whole model never leaves its client, and how much local work a client does.

The settings of the star algorithms that ship whole models (FedAvg and those built on its
round: FedProx, Ditto, pFedMe, FedNova, FedBN), docs/ALGORITHMS.md §3:

- `local_layers` (FedBN, Li et al. 2021, generalised): the tensors named by it stay on the
  client. With L_k those tensors of client k and G the others (the shared ones):
      server:          sends w_G (never w_L) to every k ∈ S_t
      client k ∈ S_t:  w_k ← (w_G received, L_k kept);  w_k ← LocalSGD(w_k)
                       sends only its G part
      server:          w_G ← the aggregation of the G parts
  and every client is evaluated with the new w_G over its own L_k. The client therefore
  keeps its model between rounds (the algorithm's `keeps` gains "model").
  "batchnorm" names every batch-norm layer's weight, bias, running mean, running variance
  and counter (torch's `_BatchNorm` modules); a tuple names parameter-name prefixes, matched
  whole dot-separated components ("backbone.fc" is `backbone.fc.*`, not `backbone.fc2.*`).
- `epochs_max` (heterogeneous local work, FedNova's setting, Wang et al. 2020): each sampled
  client draws its epochs E_k uniformly from {E, …, E_max}, seeded by (seed, round, client),
  so FedAvg and FedNova compare on the very same local work.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from raymtl.algorithms.base import LocalTrainingParams, StepContext
from raymtl.algorithms.training import derive_seed, model_tensors

BATCHNORM = "batchnorm"
LocalLayers = tuple[str, ...] | Literal["batchnorm"] | None


class WholeModelParams(LocalTrainingParams):
    """Local SGD (§2) plus what stays on a client and how its local work varies."""

    local_layers: tuple[str, ...] | Literal["batchnorm"] | None = Field(
        None,
        description="tensors that never leave a client: parameter-name prefixes, or "
        "'batchnorm' (every batch-norm layer's weight, bias and statistics); null = none",
    )
    epochs_max: int | None = Field(
        None,
        ge=1,
        description="heterogeneous work: each sampled client draws its epochs uniformly "
        "from epochs..epochs_max every round; null = every client runs `epochs`",
    )

    @field_validator("local_layers", mode="before")
    @classmethod
    def _one_prefix(cls, value):
        # `local_layers: backbone.fc` in a file or on the command line: one prefix.
        if isinstance(value, str) and value != BATCHNORM:
            return (value,)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> WholeModelParams:
        prefixes = self.local_layers
        if isinstance(prefixes, tuple) and not (prefixes and all(p.strip(".") for p in prefixes)):
            raise ValueError("local_layers: name a non-empty prefix, 'batchnorm', or null")
        if self.epochs_max is not None and self.epochs_max < self.epochs:
            raise ValueError(
                f"epochs_max: {self.epochs_max} is below epochs = {self.epochs} (the draw is "
                "from epochs..epochs_max)"
            )
        return self


def local_names(model: nn.Module, local_layers: LocalLayers) -> set[str]:
    """The state_dict names of `model` that `local_layers` keeps on the client (see the
    module docstring); the empty set for None."""
    if local_layers is None:
        return set()
    if local_layers == BATCHNORM:
        names = set()
        for prefix, module in model.named_modules(remove_duplicate=False):
            if isinstance(module, _BatchNorm):
                own = [*module.named_parameters(recurse=False)]
                own += module.named_buffers(recurse=False)
                names.update(f"{prefix}.{name}" if prefix else name for name, _ in own)
        return names
    heads = [prefix.strip(".") for prefix in local_layers]
    return {
        name
        for name in model.state_dict()
        if any(name == head or name.startswith(head + ".") for head in heads)
    }


def shared_tensors(model: nn.Module, local: set[str]) -> dict[str, torch.Tensor]:
    """`model_tensors(model)` without the names in `local`: what leaves a client or the
    server."""
    return {name: value for name, value in model_tensors(model).items() if name not in local}


def check_local_layers(model: nn.Module, local_layers: LocalLayers, participant: str) -> None:
    """Refuse (one line) `local_layers` that keep nothing of `model` (a prefix that matches
    no tensor: a typo, or 'batchnorm' on a model without batch norm), or everything (nothing
    would travel)."""
    if local_layers is None:
        return
    local = local_names(model, local_layers)
    floats = {name for name, value in model.state_dict().items() if value.is_floating_point()}
    what = f"the model of {participant} ({type(model).__name__})"
    if not local:
        kind = "has no batch-norm layer" if local_layers == BATCHNORM else "has no tensor named"
        named = "" if local_layers == BATCHNORM else " " + ", ".join(f"{p}.*" for p in local_layers)
        raise ValueError(f"algorithm.params.local_layers: {what} {kind}{named}")
    if floats <= local:
        raise ValueError(
            f"algorithm.params.local_layers: they cover every tensor of {what}: nothing would "
            "travel (use algorithm local)"
        )


def round_epochs(params, ctx: StepContext) -> int:
    """E_k: the client's epochs this round, uniform over epochs..epochs_max (seeded by
    (seed, round, client), the same wherever the client runs); `epochs` without a maximum."""
    most = getattr(params, "epochs_max", None)
    if most is None or most == params.epochs:
        return params.epochs
    generator = torch.Generator().manual_seed(derive_seed(ctx.seed, ctx.round, ctx.me, "epochs"))
    return int(torch.randint(params.epochs, most + 1, (1,), generator=generator))


def round_params(params, ctx: StepContext):
    """`params` with this round's epochs E_k for the client (`round_epochs`): unchanged
    (the same object) when every client runs `epochs`."""
    epochs = round_epochs(params, ctx)
    return params if epochs == params.epochs else params.model_copy(update={"epochs": epochs})
