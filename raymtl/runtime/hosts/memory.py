"""Memory an algorithm's per-client state will take, checked before any actor starts.

An algorithm that keeps large state per client (Sheaf-FMTL: Σ_j d_ij·d_i floats of maps)
says how much from each client's d_i (`state_size(model)`) and the federation
(`persistent_bytes`; None, the default, for an algorithm that keeps nothing beyond its
models: the check is skipped). The runtime builds each architecture once to measure d_i, and
refuses a run above runtime.memory_budget in one line with the figures (default budget: the
memory Ray reports for the cluster, or this machine's available memory without Ray); a run
that fits prints the need per host and in all.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

from raymtl.config import ConfigError


def available_memory() -> int:
    """This machine's available memory (MemAvailable on Linux; free pages elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gigabytes(count: float) -> str:
    return "no limit" if count == float("inf") else f"{count / 1e9:.2f} GB"


def client_dims(algorithm, federation, build) -> list[int]:
    """d_i of every client, building each (architecture, head size) once."""
    sizes: dict[tuple, int] = {}
    dims = []
    for i in range(federation.num_clients):
        key = (federation.models[i] if federation.models else None, federation.num_classes[i])
        if key not in sizes:
            sizes[key] = algorithm.state_size(build(*key))
        dims.append(sizes[key])
    return dims


def check_state_memory(algorithm, federation, hosts: dict, budget: int, build) -> dict | None:
    """Print the per-host and total need; refuse a run above `budget`. Returns the figures
    (None: the algorithm keeps nothing beyond its models, `persistent_bytes` is None)."""
    per_client = algorithm.persistent_bytes(client_dims(algorithm, federation, build), federation)
    if per_client is None:
        return None
    per_host = {
        host: sum(per_client[int(p.split("/")[1])] for p in members if p.startswith("client/"))
        for host, members in hosts.items()
    }
    total, largest = sum(per_client), max(per_host.values(), default=0)
    if total > budget:  # the figures are the error's: no line of them before it
        raise ConfigError(
            f"runtime.memory_budget: {algorithm.name} needs {gigabytes(total)} "
            f"({gigabytes(largest)} in the largest actor), over {gigabytes(budget)}; "
            f"{algorithm.memory_knobs}"
        )
    print(
        f"{algorithm.name}: per-client state needs {gigabytes(total)} in all, at most "
        f"{gigabytes(largest)} per actor (budget {gigabytes(budget)})"
    )
    return {"total": total, "per_host": per_host, "per_client": per_client}


# A step's working memory per model slot: the weights, their gradients, the optimiser's
# momenta and a copy read back after the step (activations come on top and are not counted).
STEP_COPIES = 4


def client_gpu_bytes(
    algorithm, federation, shards: dict, hosts: dict, build, batch_clients: int
) -> dict[str, dict[str, int]]:
    """What each client host keeps on its GPU, by part: its clients' data (train and test
    samples and targets, moved to the device), the working models (per architecture, one a
    batched client, each with its step's gradients and momenta), the clients' kept weights
    (`Algorithm.keeps` holds "model") and the public set when the algorithm uses it."""
    sample = 4 * math.prod(federation.input_shape)  # float32 inputs
    model_bytes: dict[tuple, int] = {}

    def bytes_of(key) -> int:
        if key not in model_bytes:
            model = build(*key)
            model_bytes[key] = sum(
                t.numel() * t.element_size() for t in model.state_dict().values()
            )
        return model_bytes[key]

    need = {}
    for host, members in hosts.items():
        clients = [int(p.split("/")[1]) for p in members if p.startswith("client/")]
        if not clients:
            continue
        data = kept = 0
        architectures = set()
        for i in clients:
            shard = shards[f"client/{i}"]
            task = federation.task_specs[shard.task] if federation.task_specs else None
            target = 8 if task is None or task.loss == "cross_entropy" else 4 * task.outputs
            data += (len(shard.train_idx) + len(shard.test_idx)) * (sample + target)
            key = (federation.models[i] if federation.models else None, federation.num_classes[i])
            architectures.add(key)
            if "model" in algorithm.keeps:
                kept += bytes_of(key)
        working = sum(bytes_of(key) for key in architectures) * STEP_COPIES * batch_clients
        public = federation.public_size * sample if algorithm.uses_public else 0
        need[host] = {"data": data, "models": working, "kept": kept, "public": public}
    return need


def check_gpu_memory(need: dict[str, dict[str, int]], share: float, device_bytes: int) -> None:
    """Refuse, in one line, client hosts whose GPU memory need (`client_gpu_bytes`) passes
    their share of the device (`share` of `device_bytes`: fractional GPUs share one device's
    memory as they share its time)."""
    room = min(1.0, share) * device_bytes
    host, parts = max(need.items(), key=lambda item: sum(item[1].values()), default=(None, {}))
    if host is None or sum(parts.values()) <= room:
        return
    detail = ", ".join(f"{name} {gigabytes(size)}" for name, size in parts.items() if size)
    raise ConfigError(
        f"runtime.num_gpus_per_actor: {share:g} of a {gigabytes(device_bytes)} GPU gives each "
        f"client actor {gigabytes(room)}, and {host} needs {gigabytes(sum(parts.values()))} "
        f"on it ({detail}; activations come on top); give fewer clients an actor "
        "(runtime.clients_per_actor), a larger num_gpus_per_actor, a smaller batch_clients, "
        "or device: cpu"
    )


def peak_rss() -> int:
    """This process's peak resident memory since it started or since `reset_peak_rss`, in
    bytes (Linux's VmHWM; elsewhere getrusage's maximum, which cannot be reset)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> None:
    """Start the peak over from the memory resident now (Linux: writing 5 to clear_refs), so
    an actor reused for another federation reports that federation's peak alone."""
    with contextlib.suppress(OSError):  # not Linux, or not allowed: the peak stays
        Path("/proc/self/clear_refs").write_text("5")


def return_freed_memory() -> None:
    """Hand memory freed by Python and torch back to the system (glibc's malloc_trim), so
    an idle actor does not sit on what its last federation used."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
