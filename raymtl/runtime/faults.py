"""faults.parquet rows: every lost host, and what the run did about it.

rolled back to round k, replaying   the whole federation reloads its last complete
                                    checkpoint (runtime.max_restarts recoveries a seed)
run stopped                         no recovery left
continued without client/...        min_clients_fraction < 1: the lost clients are left
                                    out for good (rolled_back_to = -1)
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def fault_rows(seed, round_index, fault, start, count, recover, seconds_lost) -> list[dict]:
    """One row per lost host of a `HostsLost` (a roll-back, or the end of the run)."""
    action = f"rolled back to round {start}, replaying" if recover else "run stopped"
    return [
        {"seed": seed, "round": round_index, "host": host, "node": node,
         "during": fault.method, "recovery": count, "action": action, "rolled_back_to": start,
         "seconds_lost": seconds_lost, "error": fault.detail}
        for host, node in fault.nodes.items()
    ]  # fmt: skip


def dropped_rows(seed, round_index, executor, router) -> list[dict]:
    """Client hosts lost with enough participants left: the run goes on without them, and
    what they were handed was not delivered (their bits are retracted)."""
    rows = []
    for drop in executor.drain_dropped():
        router.retract(set(drop["participants"]))
        action = f"continued without {', '.join(drop['participants'])}"
        rows.append({"seed": seed, "round": round_index, "host": drop["host"],
                     "node": drop["node"], "during": drop["during"], "recovery": 0,
                     "action": action, "rolled_back_to": -1, "seconds_lost": 0.0,
                     "error": drop["error"]})  # fmt: skip
        log.warning("seed %d round %d: host %s lost; %s", seed, round_index, drop["host"], action)
    return rows


class AlgorithmWarnings(logging.Handler):
    """Collects the warnings algorithm code logs during a step (a rejected non-finite update):
    they become rows of warnings.parquet and lines on the driver's console, not lines lost in
    a worker's log."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("raymtl.algorithms").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("raymtl.algorithms").removeHandler(self)
