"""Bit accounting: which link a message crossed, and which clients it is charged to."""

from __future__ import annotations

from raymtl.algorithms.base import role_of

TIER = {"client": 0, "leader": 1, "lps": 1, "server": 2}


def link_direction(row: dict) -> str | None:
    """'down' towards the clients (server -> LPS -> client, leader -> member), 'up' otherwise
    (peers, and leader to leader: up).

    Two cases are recorded in messages.parquet but are neither uplink nor downlink (None):
    traffic with the graph service (a coordinator-side helper of the server), and a hand-off
    between a client and a role that same client holds (one machine: nothing on the wire).
    """
    if "graph" in (row["src_role"], row["dst_role"]):
        return None
    if row.get("src_client") is not None and row.get("src_client") == row.get("dst_client"):
        return None
    return "down" if TIER[row["src_role"]] > TIER[row["dst_role"]] else "up"


def charged_client(participant: str, holders: dict[str, int]) -> int | None:
    """The client whose link carries `participant`'s traffic (None: server, LPS, graph)."""
    if role_of(participant) == "client":
        return int(participant.split("/")[1])
    return holders.get(participant)


def charge(ledger: list[dict], holders: dict[str, int]) -> list[dict]:
    """Each ledger row with the clients charged for its sending and receiving ends."""
    for row in ledger:
        row["src_client"] = charged_client(row["src"], holders)
        row["dst_client"] = charged_client(row["dst"], holders)
    return ledger


def round_bits(ledger: list[dict], num_clients: int) -> tuple[list[int], list[int]]:
    """Per-client bits sent (up) and received (down) from one round's charged ledger."""
    up, down = [0] * num_clients, [0] * num_clients
    for row in ledger:
        if link_direction(row) is None:
            continue
        if row["src_client"] is not None:
            up[row["src_client"]] += row["bits"]
        if row["dst_client"] is not None:
            down[row["dst_client"]] += row["bits"]
    return up, down


# rounds.parquet's running totals: a round's row adds its own figures to the previous row's.
CUMULATIVE = ("cum_bits_up", "cum_bits_down", "cum_flops")


def resumed_totals(rounds, seed: int, upto: int) -> tuple[float, dict[str, float]]:
    """Wall time and the running totals (CUMULATIVE) of `seed` at round `upto` (0: a fresh
    start), from the rounds already recorded: a resumed run goes on counting from them."""
    fresh = dict.fromkeys(CUMULATIVE, 0)
    if not upto or rounds.empty:
        return 0.0, fresh
    frame = rounds[(rounds["seed"] == seed) & (rounds["round"] <= upto)]
    if frame.empty:
        return 0.0, fresh
    last = frame.sort_values("round").iloc[-1]
    totals = {
        "cum_bits_up": int(last["cum_bits_up"]),
        "cum_bits_down": int(last["cum_bits_down"]),
        # NaN when resumed from rounds recorded before FLOPs were counted: unknown stays so
        "cum_flops": float(last["cum_flops"]),
    }
    return float(frame["wall_time"].max()), totals
