"""faults.parquet rows: every lost host, and what the run did about it.

rolled back to round k, replaying   the whole federation reloads its last complete
                                    checkpoint (runtime.max_restarts recoveries a seed)
run stopped                         no recovery left
continued without client/...        min_clients_fraction < 1: the lost clients are left
                                    out for good (rolled_back_to = -1)
re-planned: runtime.clients_...     a node was lost and the client actors no longer fit the
                                    nodes left: more clients an actor (host "client actors",
                                    rolled_back_to = -1); the results are the same
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class RunStopped(RuntimeError):
    """The run cannot go on (recoveries used up, actors Ray cannot place): one line, exit
    code 3 on the command line. The run directory keeps its last complete checkpoint, so
    `raymtl run --resume RUN_DIR` goes on once the cause is fixed."""


def fault_rows(seed, round_index, fault, start, count, recover, seconds_lost) -> list[dict]:
    """One row per lost host of a `HostsLost` (a roll-back, or the end of the run)."""
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
            }
        )
        log.warning("seed %d round %d: host %s lost; %s", seed, round_index, drop["host"], action)
    return rows


def replan_row(seed: int, round_index: int, line: str, nodes: list[str], recovery: int) -> dict:
    """The client actors laid out anew on the nodes left (RayExecutor.replanned's line)."""
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
    }
