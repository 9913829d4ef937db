"""What the machines the hosts run on have, and what the hosts hold: the GPU torch sees where
a client host trains and its memory, the memory the hosts may use (the executor's `probes`:
`Probes` in process, `RayProbes` on a Ray cluster), and two questions every host answers
(`state_report`, `peak_memory`).

Under Ray the GPU is the actor's (Ray sets its CUDA_VISIBLE_DEVICES), not the driver's: a
task given a client actor's GPU share is asked what torch sees there, once per share and Ray
session (`GPU_PROBES`). The planner reads the answer (layout.py `client_device`): a share
torch cannot use trains on CPU under `device: auto`.
"""

from __future__ import annotations

from collections import Counter

from raymtl.config import RuntimeConfig
from raymtl.runtime.actors.pool import POOL, ActorKind
from raymtl.runtime.executors.placement import trial_group_strategy
from raymtl.runtime.results import Answer


class Probes:
    """What a host in this process has: the driver's GPU and memory."""

    def torch_sees_gpu(self) -> bool | None:
        """Whether torch sees a GPU where client hosts run (None: not known)."""
        import torch

        return torch.cuda.is_available()

    def gpu_memory(self) -> int | None:
        """Bytes of memory of the GPU a client host trains on (None: none, or not known)."""
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_properties(0).total_memory

    def memory_available(self) -> int:
        """Memory the hosts may use: this machine's."""
        from raymtl.runtime.hosts.memory import available_memory

        return available_memory()


class RayProbes(Probes):
    """What a client actor has on the Ray cluster `ray` is connected to."""

    def __init__(self, ray, runtime: RuntimeConfig):
        self._ray, self.runtime = ray, runtime

    def torch_sees_gpu(self) -> bool | None:
        """Whether torch sees a GPU in a task given a client actor's GPU share (Ray sets its
        CUDA_VISIBLE_DEVICES as it does the actor's); None when no such task was placed
        within runtime.placement_timeout_s (then the actors' placement says why)."""
        seen = self._gpu_probe()
        return None if seen is None else seen[0]

    def gpu_memory(self) -> int | None:
        """Bytes of memory of the GPU a task given a client actor's share sees (None: none,
        or no such task was placed)."""
        seen = self._gpu_probe()
        return None if seen is None or not seen[0] else seen[1]

    def memory_available(self) -> int:
        """The memory Ray reports for the cluster's tasks and actors."""
        return int(self._ray.cluster_resources().get("memory", 0)) or super().memory_available()

    def _gpu_probe(self) -> tuple[bool, int] | None:
        """What a task given a client actor's GPU share sees: asked once per share and Ray
        session (`GPU_PROBES`). Idle actors of the reuse session that hold GPUs and are of
        another kind go first: they would hold the room the probe needs, and this layout
        cannot use them."""
        ray, runtime = self._ray, self.runtime
        share = runtime.num_gpus_per_actor
        key = (ray.get_runtime_context().get_job_id(), share)
        if key not in GPU_PROBES:
            client_kind = ActorKind("client", runtime.num_cpus_per_actor, share)
            keep = Counter(
                idle.kind
                for idle in POOL.idle
                if not idle.kind.num_gpus or idle.kind == client_kind
            )
            POOL.keep_only(keep, ray.kill)
            probe = ray.remote(num_cpus=0, num_gpus=share)
            where = trial_group_strategy() or "DEFAULT"  # a Tune trial's GPUs are its group's
            task = probe(gpu_seen_by_torch).options(max_retries=0, scheduling_strategy=where)
            answer = task.remote()
            ready, _ = ray.wait([answer], timeout=runtime.placement_timeout_s)
            if not ready:
                ray.cancel(answer, force=True)
                return None
            GPU_PROBES[key] = tuple(ray.get(answer))
        return GPU_PROBES[key]


# (Ray job, GPU share) -> what a task given that share saw: (torch sees a GPU, its bytes).
GPU_PROBES: dict[tuple, tuple[bool, int]] = {}


def gpu_seen_by_torch() -> tuple[bool, int]:
    """Run inside a task holding a GPU share: whether torch sees a GPU there, and its
    memory in bytes (0 without one)."""
    import torch

    if not torch.cuda.is_available():
        return False, 0
    return True, torch.cuda.get_device_properties(0).total_memory


def state_report(executor) -> Answer:
    """Clients' kept state over every client host of `executor`: bytes resident and
    spilled."""
    hosts = executor.members.client_hosts()
    answer = executor.call("state_report", {name: () for name in hosts})
    total: dict[str, int] = {}
    for report in answer.value.values():
        for key, value in report.items():
            total[key] = total.get(key, 0) + value
    return Answer(total, answer.lost)


def peak_memory(executor) -> Answer:
    """Peak resident bytes of every host's process (in process: all the same process)."""
    return executor.call("peak_memory", {name: () for name in executor.hosts})
