"""How many client actors fit where, and the one line that says what a layout lacks.

Room is a mapping of places (Ray nodes, or the bundles of a Tune trial's placement group) to
their resources. An actor never spans two places, so room is counted place by place, by CPUs
and by GPUs: six actors of a quarter GPU need two GPUs' worth of room, however many CPUs the
node has. Pure arithmetic: the Ray executor reads the room from Ray and decides what to do.
"""

from __future__ import annotations

import math


def actors_that_fit(room: dict[str, dict[str, float]], cpus: float, gpus: float) -> int:
    """How many actors of `cpus` CPUs and `gpus` GPUs the places of `room` hold."""
    total = 0
    for resources in room.values():
        # The small epsilon keeps 0.3 + 0.3 + 0.3 of 0.9 CPUs at three actors.
        fits = int(resources.get("CPU", 0.0) / cpus + 1e-9)
        if gpus > 0:
            fits = min(fits, int(resources.get("GPU", 0.0) / gpus + 1e-9))
        total += fits
    return total


def auto_clients_per_actor(num_clients: int, capacity: int) -> int:
    """`clients_per_actor: auto`: the client actors fill the room once, ⌈N / capacity⌉
    clients each (at least one client an actor)."""
    return max(1, math.ceil(num_clients / max(1, capacity)))


def fitted_clients_per_actor(num_clients: int, wanted: int, capacity: int) -> int:
    """`wanted` clients an actor when their actors fit `capacity` actors, else the fewest
    clients an actor that do (capacity >= 1)."""
    if math.ceil(num_clients / wanted) <= capacity:
        return wanted
    return math.ceil(num_clients / capacity)


def amount(value: float, unit: str) -> str:
    """'1 CPU', '2 CPUs', '0.5 GPU', '0 GPUs'."""
    return f"{value:g} {unit}" + ("" if value == 1 or 0 < value < 1 else "s")


def actor_needs(cpus: float, gpus: float) -> str:
    """What one client actor asks Ray for: '1 CPU', '1 CPU and 0.5 GPU'."""
    needs = amount(cpus, "CPU")
    if gpus:
        needs += f" and {amount(gpus, 'GPU')}"
    return needs


def nodes_have(room: dict[str, dict[str, float]], gpus: bool) -> str:
    """What the places hold in all: '2 CPUs', '2 CPUs and 1 GPU'."""
    have = amount(sum(r.get("CPU", 0.0) for r in room.values()), "CPU")
    if gpus:
        have += f" and {amount(sum(r.get('GPU', 0.0) for r in room.values()), 'GPU')}"
    return have


def missing(room: dict[str, dict[str, float]], actors: int, cpus: float, gpus: float) -> str:
    """What `actors` actors lack on `room`: the resources whose total falls short ('0.5 GPU
    missing'), or, when the totals suffice, that they do not fit place by place."""
    short = []
    for unit, each in (("CPU", cpus), ("GPU", gpus)):
        lacking = actors * each - sum(r.get(unit, 0.0) for r in room.values())
        if each and lacking > 1e-9:
            short.append(amount(round(lacking, 6), unit))
    if short:
        return " and ".join(short) + " missing"
    return "enough in all, but not on any one node for each actor"


def layout_refusal(
    room: dict[str, dict[str, float]],
    where: str,
    num_clients: int,
    clients_per_actor: int | str,
    cpus: float,
    gpus: float,
) -> str | None:
    """None when the client actors of this layout fit `room`; else the one line that says
    what is missing and what would fit. `where` names the room ("this machine's Ray", "the
    cluster", "the trial's placement group")."""
    capacity = actors_that_fit(room, cpus, gpus)
    if clients_per_actor == "auto":
        per_actor = auto_clients_per_actor(num_clients, capacity)
    else:
        per_actor = int(clients_per_actor)
    actors = math.ceil(num_clients / per_actor)
    if capacity and actors <= capacity:
        return None
    needs = actor_needs(cpus, gpus)
    have = f"{where} has {nodes_have(room, gpus > 0)}"
    if not capacity:
        lacking = missing(room, 1, cpus, gpus)
        if gpus and not sum(r.get("GPU", 0.0) for r in room.values()):
            hint = "runtime.num_gpus_per_actor: 0 to train on CPUs"
        else:
            hint = "a smaller runtime.num_cpus_per_actor or num_gpus_per_actor"
        return f"runtime: not one client actor of {needs} fits: {have} ({lacking}); give {hint}"
    fits = fitted_clients_per_actor(num_clients, per_actor, capacity)
    return (
        f"runtime.clients_per_actor: {clients_per_actor} makes {actors} client actors of "
        f"{needs} for {num_clients} clients; {have}, room for {capacity} "
        f"({missing(room, actors, cpus, gpus)}); give clients_per_actor: {fits} or auto, or "
        "ask less of each actor (runtime.num_cpus_per_actor, num_gpus_per_actor)"
    )
