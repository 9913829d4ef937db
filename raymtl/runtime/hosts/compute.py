"""How a host's client steps compute: runtime.precision's autocast, runtime.deterministic's
CUDA settings, and the warm-up that pays torch's one-time costs while the host starts rather
than inside round 1."""

from __future__ import annotations

import contextlib
import copy
import os

import torch

# cuBLAS keeps its reductions in a fixed order only with a fixed workspace (CUDA's docs,
# "Results reproducibility"); read when the process creates its first cuBLAS handle.
CUBLAS_WORKSPACE = ":4096:8"


def deterministic(on: bool, device: str) -> None:
    """runtime.deterministic on a host training on a GPU: torch's deterministic algorithms
    (where an op has none, torch warns rather than fails), cuDNN's deterministic
    convolutions without autotuning, and cuBLAS's fixed workspace. Off: cuDNN autotunes.
    Nothing changes on the CPU, whose kernels give the same numbers run after run already.
    Uninitialised memory is not filled (torch would fill every `empty` under the switch)."""
    if not device.startswith("cuda"):
        return
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(on, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = not on


def precision(setting: str, device: str):
    """runtime.precision (Lightning's names): under bf16-mixed, a client's steps and its
    evaluation run under bfloat16 autocast (matmuls and convolutions in bfloat16), while
    weights, optimiser state and every other role's maths (aggregation, HCA, graphs) stay in
    float32; what the steps send travels in float32 (`float32_on_the_wire`)."""
    if setting != "bf16-mixed":
        return contextlib.nullcontext()
    kind = "cuda" if device.startswith("cuda") else "cpu"
    # No cast cache: a step runs many optimiser steps inside this one context, and cached
    # bfloat16 copies of the weights would freeze them at their first value.
    return torch.autocast(device_type=kind, dtype=torch.bfloat16, cache_enabled=False)


def float32_on_the_wire(tensors: dict) -> dict:
    """A message's tensors under runtime.precision bf16-mixed: a bfloat16 tensor (a product
    autocast made in a client's step, e.g. FedMuscle's representations) replaced by its
    float32 copy, in the message's own dict (a dict sent to many peers stays one object).
    Messages so travel, and are counted, in float32 as under fp32: the setting changes how
    clients compute, never what the wire carries. Returns `tensors`."""
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
            tensors[name] = value.float()
    return tensors


# CPU flags of native bfloat16 arithmetic (/proc/cpuinfo). Without them torch emulates bf16
# matmuls and convolutions: on an AVX2-only EPYC the overhead workload's rounds took 380 s
# under bf16-mixed against 46 s in fp32 (benchmarks/RESULTS.md).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_emulated(cpuinfo: str | None = None) -> bool:
    """Whether this machine's CPU lacks bfloat16 units (False where /proc/cpuinfo is
    unreadable: nothing to say)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as handle:
                cpuinfo = handle.read()
        except OSError:
            return False
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return bool(flags) and not any(flag in flags.split() for flag in BF16_CPU_FLAGS)


def warm_up(state, autocast) -> None:
    """A fresh process pays torch's one-time costs on its first training step (the
    optimiser's first step imports torch._dynamo and its dependencies, longer than a whole
    later client step): a host pays them while it starts, on a copy of its first client's
    model, not inside round 1. Nothing of any client changes."""
    model = copy.deepcopy(state.model)
    with autocast:
        model(state.data.train_x[:2]).float().sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.0).step()
