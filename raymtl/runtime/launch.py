"""Where a federation's hosts run: the executor runtime.executor names, and the Ray it needs
(joined at runtime.address, or started here; one already running is reused)."""

from __future__ import annotations

import time
from collections.abc import Callable

from raymtl.config import ExperimentConfig
from raymtl.runtime.executor import Executor


def start_ray(cfg: ExperimentConfig) -> float:
    """Join `runtime.address` or start a local Ray (dashboard on 127.0.0.1); seconds taken."""
    import ray

    if ray.is_initialized():
        return 0.0
    began = time.perf_counter()
    runtime = cfg.runtime
    if runtime.address:  # a cluster: `ray job submit --working-dir .` ships the code
        ray.init(address=runtime.address, log_to_driver=False)
    else:  # a Ray of its own ("local": never a `ray start` head running here); workers use
        # this interpreter, where raymtl is installed
        ray.init(
            address="local",
            num_cpus=runtime.num_cpus,
            include_dashboard=runtime.dashboard,
            dashboard_host="127.0.0.1",
            log_to_driver=False,
        )
    return time.perf_counter() - began


def inline_executors(cfg: ExperimentConfig) -> Callable[[], Executor]:
    from raymtl.runtime.executor import InlineExecutor

    return lambda: InlineExecutor(cfg.runtime)


def ray_executors(cfg: ExperimentConfig) -> Callable[[], Executor]:
    import ray

    from raymtl.runtime.ray_executor import RayExecutor, alive_nodes

    seconds = start_ray(cfg)
    # The nodes the run starts on: one of them dead later (a recovery, the next seed) makes
    # the executors lay the client actors out on the nodes left.
    nodes = alive_nodes(ray)
    return ExecutorMaker(lambda: RayExecutor(cfg.runtime, nodes), seconds)


class ExecutorMaker:
    """A maker of fresh executors, and the seconds it took to start (or join) Ray for them:
    the first federation to start records them in startup.parquet, then sets them to 0."""

    def __init__(self, make: Callable[[], Executor], ray_start_s: float = 0.0):
        self.make, self.ray_start_s = make, ray_start_s

    def __call__(self) -> Executor:
        return self.make()


# runtime.executor -> (cfg -> a maker of fresh executors, ready to use)
EXECUTORS = {"inline": inline_executors, "ray": ray_executors}


def executor_factory(cfg: ExperimentConfig) -> Callable[[], Executor]:
    """A fresh executor per federation (and per recovery), of the configured kind."""
    return EXECUTORS[cfg.runtime.executor](cfg)
