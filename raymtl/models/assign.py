"""Which model each client trains: one for all, a seeded mix, per task, or a list.

    model.name                  every client (as before; model.params apply to it)
    model.mix {name: share}     ⌊share·N⌉ clients each (largest remainders, so the counts sum
                                to N and differ from the shares by less than one), dealt in a
                                seeded random order: near-equal shares of small/medium/large
    model.by_task {task: name}  the clients of a task group (data.tasks names); others: name
    model.clients [names]       client i trains names[i]

Only the names travel (FederationInfo.models); each host builds its clients' models itself.
"""

from __future__ import annotations

import numpy as np


def _fail(field: str, problem: str) -> ValueError:
    return ValueError(f"model.{field}: {problem}")


def mix_counts(shares: dict[str, float], num_clients: int) -> dict[str, int]:
    """Clients per model, proportional to the shares (largest remainders)."""
    names = list(shares)
    weights = np.array([shares[n] for n in names], dtype=float)
    exact = weights / weights.sum() * num_clients
    counts = np.floor(exact).astype(int)
    by_remainder = np.argsort(-(exact - counts), kind="stable")
    counts[by_remainder[: num_clients - counts.sum()]] += 1
    return dict(zip(names, counts.tolist(), strict=True))


def assign_models(
    num_clients: int,
    name: str,
    *,
    seed: int,
    mix: dict[str, float] | None = None,
    by_task: dict[str, str] | None = None,
    clients: list[str] | None = None,
    task_names: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """The model name of every client (see the module docstring)."""
    if clients is not None:
        if len(clients) != num_clients:
            raise _fail("clients", f"{len(clients)} names for {num_clients} clients")
        return tuple(clients)
    if mix is not None:
        counts = mix_counts(mix, num_clients)
        dealt = [model for model, count in counts.items() for _ in range(count)]
        order = np.random.default_rng([seed, 0x6D6F64656C]).permutation(num_clients)
        return tuple(dealt[position] for position in np.argsort(order))
    if by_task is not None:
        unknown = sorted(set(by_task) - set(task_names))
        if unknown:
            raise _fail("by_task", f"{unknown} are not tasks (tasks: {sorted(set(task_names))})")
        return tuple(by_task.get(task, name) for task in task_names)
    return (name,) * num_clients
