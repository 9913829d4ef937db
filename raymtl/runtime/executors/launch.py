"""Where a federation's hosts run: the executor runtime.executor names, and the Ray it needs
(joined at runtime.address; else the `raymtl up` service's, warm/service.py; else started
here; one already running in this process is reused)."""

from __future__ import annotations

import time
from collections.abc import Callable

from raymtl.config import ExperimentConfig
from raymtl.runtime.actors.pool import POOL
from raymtl.runtime.executors.executor import Executor
from raymtl.runtime.warm.service import join, quiet_local_ray


def start_ray(cfg: ExperimentConfig, join_up: bool | None = None) -> float:
    """Join `runtime.address`, or the `raymtl up` service running this code (unless
    runtime.join_up or `join_up` says no: Tune trials never join), or start a local Ray
    (dashboard on 127.0.0.1 when asked); seconds taken."""
    import ray

    if ray.is_initialized():
        return 0.0
    began = time.perf_counter()
    POOL.lender = None  # a Ray of an earlier start in this process: `join` sets it again
    runtime = cfg.runtime
    if runtime.address:  # a cluster: `ray job submit --working-dir .` ships the code
        ray.init(address=runtime.address, log_to_driver=False)
    else:
        if not join(ray, runtime.join_up if join_up is None else join_up):
            ray.init(**quiet_local_ray(runtime.num_cpus, runtime.dashboard))
    return time.perf_counter() - began


def inline_executors(cfg: ExperimentConfig) -> ExecutorMaker:
    from raymtl.runtime.executors.executor import InlineExecutor

    return ExecutorMaker(lambda: InlineExecutor(cfg.runtime))


def ray_executors(cfg: ExperimentConfig) -> ExecutorMaker:
    import ray

    from raymtl.runtime.executors.placement import alive_nodes
    from raymtl.runtime.executors.ray_executor import RayExecutor

    seconds = start_ray(cfg)
    # The nodes the run starts on: one of them dead later (a recovery, the next seed) makes
    # the executors lay the client actors out on the nodes left.
    nodes = alive_nodes(ray)
    joined_up = POOL.lender is not None
    return ExecutorMaker(lambda: RayExecutor(cfg.runtime, nodes), seconds, joined_up)


class ExecutorMaker:
    """A maker of fresh executors (one per federation, and per recovery), with what starting
    them cost: the seconds it took to start (or join) Ray, which the first federation to
    start records in startup.parquet (`take_ray_start_s` hands them out once), and whether
    that Ray is `raymtl up`'s (`joined_up`, recorded for every seed)."""

    def __init__(
        self, make: Callable[[], Executor], ray_start_s: float = 0.0, joined_up: bool = False
    ):
        self.make, self._ray_start_s, self.joined_up = make, ray_start_s, joined_up

    def __call__(self) -> Executor:
        return self.make()

    def take_ray_start_s(self) -> float:
        """The seconds Ray took to start for these executors: once, then 0."""
        seconds, self._ray_start_s = self._ray_start_s, 0.0
        return seconds

    @classmethod
    def of(cls, make: Callable[[], Executor]) -> ExecutorMaker:
        """`make` as a maker (a plain callable: no Ray started for it)."""
        return make if isinstance(make, cls) else cls(make)


# runtime.executor -> (cfg -> a maker of fresh executors, ready to use)
EXECUTORS = {"inline": inline_executors, "ray": ray_executors}


def executor_factory(cfg: ExperimentConfig) -> ExecutorMaker:
    """A fresh executor per federation (and per recovery), of the configured kind."""
    return EXECUTORS[cfg.runtime.executor](cfg)
