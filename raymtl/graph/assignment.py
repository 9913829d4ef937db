"""Assignments of users to local parameter servers (hierarchical FL)."""

from __future__ import annotations

import numpy as np


def random_assignment(num_clients: int, num_groups: int, seed: int) -> tuple[int, ...]:
    """Users shuffled (seeded) and dealt round-robin: group sizes differ by at most one."""
    if not 1 <= num_groups <= num_clients:
        raise ValueError(f"topology.num_lps: {num_groups} is not in [1, {num_clients}]")
    order = np.random.default_rng(seed).permutation(num_clients)
    groups = np.empty(num_clients, dtype=int)
    groups[order] = np.arange(num_clients) % num_groups
    return tuple(int(g) for g in groups)
