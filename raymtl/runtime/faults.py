"""faults.parquet rows: every lost host, and what the run did about it.

rolled back to round k, replaying   the whole federation reloads its last complete
                                    checkpoint (runtime.max_restarts recoveries a seed)
run stopped                         no recovery left
continued without client/...        min_clients_fraction < 1: the lost clients are left
                                    out for good (rolled_back_to = -1)
re-planned: runtime.clients_...     a node was lost and the client actors no longer fit the
                                    nodes left: more clients an actor (host "client actors",
                                    rolled_back_to = -1); the results are the same

`injected` is True on the rows of a fault runtime.inject_faults caused (the actor was
killed on purpose, `injection_schedule` and `kill_host`); the recovery is the same as a real
fault's.
"""

from __future__ import annotations

import logging
import random
import time

from raymtl.errors import ConfigError

log = logging.getLogger(__name__)


def injection_schedule(faults, hosts: list[str], rounds: int) -> dict[int, list[str]]:
    """runtime.inject_faults as round -> the hosts killed at its start (each (round, host)
    once). `{kill: clients, share, seed}`: round(share x client actors) client actors (at
    least one), drawn with `random.Random(seed)`, each at a round drawn from 1..rounds;
    `{kill: host, host, round}`: that host at that round. `hosts`: the federation's host
    names as laid out at its start; a name not among them, or a round after the last, is one
    ConfigError line."""
    clients = sorted((h for h in hosts if h.startswith("clients-")), key=host_index)
    schedule: dict[int, list[str]] = {}
    for index, fault in enumerate(faults):
        where = f"runtime.inject_faults.{index}"
        if fault.kill == "clients":
            draw = random.Random(fault.seed)
            count = max(1, round(fault.share * len(clients)))
            victims = draw.sample(clients, count)
            kills = [(draw.randint(1, rounds), host) for host in victims]
        else:
            if fault.host not in hosts:
                raise ConfigError(
                    f"{where}.host: '{fault.host}' is not a host of this federation (its hosts: "
                    f"{', '.join(sorted(hosts, key=host_index))})"
                )
            if fault.round > rounds:
                raise ConfigError(
                    f"{where}.round: {fault.round} is after the last round ({rounds})"
                )
            kills = [(fault.round, fault.host)]
        for round_index, host in kills:
            planned = schedule.setdefault(round_index, [])
            if host not in planned:
                planned.append(host)
    return dict(sorted(schedule.items()))


def kill_host(executor, name: str) -> None:
    """runtime.inject_faults: kill host `name`'s actor (no restart), as a crashed process
    would be, and wait until Ray reports it dead, so the fault falls in the round it was
    meant for; the host is marked in `executor.injected` (its rows say `injected`). The
    federation's recovery handles it like a real fault. Hosts in process cannot be killed
    (the config refuses inject_faults without Ray)."""
    import ray

    handle = executor.hosts[name]
    if not isinstance(handle, ray.actor.ActorHandle):
        raise NotImplementedError(f"{type(executor).__name__} cannot kill host {name}")
    executor.injected.add(name)
    ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + executor.runtime.placement_timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(handle.ping.remote(), timeout=5.0)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return
        time.sleep(0.1)


def host_index(host: str) -> tuple[str, int]:
    """clients-2 before clients-10: the name's stem, then its number."""
    stem, _, number = host.rpartition("-")
    return (stem, int(number)) if number.isdigit() else (host, -1)


class RunStopped(RuntimeError):
    """The run cannot go on (recoveries used up, actors Ray cannot place): one line, exit
    code 3 on the command line. The run directory keeps its last complete checkpoint, so
    `raymtl run --resume RUN_DIR` goes on once the cause is fixed."""


def fault_rows(
    seed, round_index, fault, start, count, recover, seconds_lost, injected=frozenset()
) -> list[dict]:
    """One row per lost host of a `HostsLost` (a roll-back, or the end of the run);
    `injected`: the hosts runtime.inject_faults killed."""
    action = f"rolled back to round {start}, replaying" if recover else "run stopped"
    return [
        {
            "seed": seed,
            "round": round_index,
            "host": host,
            "node": node,
            "during": fault.method,
            "recovery": count,
            "action": action,
            "rolled_back_to": start,
            "seconds_lost": seconds_lost,
            "error": fault.detail,
            "injected": host in injected,
        }
        for host, node in fault.nodes.items()
    ]


def dropped_rows(seed: int, round_index: int, lost: list[dict]) -> list[dict]:
    """Client hosts lost with enough participants left (an executor call's `lost`): the run
    goes on without them."""
    rows = []
    for drop in lost:
        action = f"continued without {', '.join(drop['participants'])}"
        rows.append(
            {
                "seed": seed,
                "round": round_index,
                "host": drop["host"],
                "node": drop["node"],
                "during": drop["during"],
                "recovery": 0,
                "action": action,
                "rolled_back_to": -1,
                "seconds_lost": 0.0,
                "error": drop["error"],
                "injected": bool(drop.get("injected", False)),
            }
        )
        log.warning("seed %d round %d: host %s lost; %s", seed, round_index, drop["host"], action)
    return rows


def replan_row(seed: int, round_index: int, line: str, nodes: list[str], recovery: int) -> dict:
    """The client actors laid out anew on the nodes left (RayPlacement.replanned's line)."""
    return {
        "seed": seed,
        "round": round_index,
        "host": "client actors",
        "node": ", ".join(nodes),
        "during": "start",
        "recovery": recovery,
        "action": f"re-planned: {line}",
        "rolled_back_to": -1,
        "seconds_lost": 0.0,
        "error": "",
        "injected": False,
    }
