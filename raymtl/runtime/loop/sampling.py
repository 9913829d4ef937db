"""Which clients take part in a round: ⌈m·N⌉ of them, drawn per (seed, round)."""

from __future__ import annotations

import numpy as np

from raymtl.algorithms.training import derive_seed, sample_size


def sample_clients(seed: int, round_index: int, num_clients: int, fraction: float) -> tuple:
    """⌈m·N⌉ clients uniformly without replacement, seeded by (seed, round)."""
    count = sample_size(fraction, num_clients)
    rng = np.random.default_rng(derive_seed(seed, round_index, "sample"))
    return tuple(sorted(int(i) for i in rng.choice(num_clients, size=count, replace=False)))
