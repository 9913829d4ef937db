"""How a host's client steps compute: runtime.precision's autocast, and the warm-up that
pays torch's one-time costs while the host starts rather than inside round 1."""

from __future__ import annotations

import contextlib
import copy

import torch


def precision(setting: str, device: str):
    """runtime.precision (Lightning's names): under bf16-mixed, matmuls and convolutions run
    in bfloat16 while weights, optimiser state and every other role's maths (aggregation,
    HCA, graphs) stay in float32."""
    if setting != "bf16-mixed":
        return contextlib.nullcontext()
    kind = "cuda" if device.startswith("cuda") else "cpu"
    # No cast cache: a step runs many optimiser steps inside this one context, and cached
    # bfloat16 copies of the weights would freeze them at their first value.
    return torch.autocast(device_type=kind, dtype=torch.bfloat16, cache_enabled=False)


def warm_up(state, autocast) -> None:
    """A fresh process pays torch's one-time costs on its first training step (the
    optimiser's first step imports torch._dynamo and its dependencies: ~2.5 s measured,
    against 0.3 s for a whole later client step): a host pays them while it starts, on a
    copy of its first client's model, not inside round 1. Nothing of any client changes."""
    model = copy.deepcopy(state.model)
    with autocast:
        model(state.data.train_x[:2]).float().sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.0).step()
