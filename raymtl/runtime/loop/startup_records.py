"""What a seed's federation records about its hosts besides the rounds: each start of its
hosts (a row of startup.parquet) and, once the seed is finished, each host's peak memory and
where it ran (hosts.parquet)."""

from __future__ import annotations

import time

from raymtl.runtime.executors.executor import Executor
from raymtl.runtime.executors.launch import ExecutorMaker
from raymtl.runtime.executors.probes import peak_memory
from raymtl.runtime.results import Answer
from raymtl.runtime.warm import preload


def startup_row(
    seed: int, start: int, began: float, planned: float, hosts: dict, maker: ExecutorMaker
) -> dict:
    """startup.parquet's row for hosts started from round `start`'s checkpoint: `began` and
    `planned` (perf_counter) when the start began and when the hosts were laid out; `hosts`:
    where the executor's start spent its seconds (Executor.start)."""
    # Ray started (or joined) for this run: charged to the first federation that starts
    ray_start = maker.take_ray_start_s()
    return {
        "seed": seed,
        "round": start,
        "plan_s": planned - began,
        **hosts,
        "ray_s": ray_start,
        # Ray and warm actors of `raymtl up` joined (warm/service.py) rather than started
        "joined_up": maker.joined_up,
        "total_s": time.perf_counter() - began + ray_start,
        # from the command's start: its process's, or the `raymtl` that a preloaded
        # process forked this one for (preload.py)
        "process_s": preload.seconds_since_command_start(),
        "preloaded": preload.COMMAND_STARTED is not None,
    }


def host_memory_rows(executor: Executor, seed: int, round_index: int) -> Answer:
    """hosts.parquet's rows: each host's peak resident memory over the seed (bytes), and
    where it ran: its node, the CPUs and GPUs its actor asked for, the device its clients
    trained on (inline: the driver's process, no actor); with the client hosts lost while
    they were asked."""
    answer = peak_memory(executor)
    placed = executor.placement.rows(executor)
    rows = [
        {"seed": seed, "round": round_index, "host": host, "peak_rss": int(peak)} | placed[host]
        for host, peak in sorted(answer.value.items())
    ]
    return Answer(rows, answer.lost)
