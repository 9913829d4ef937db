"""Which clients take part in a round: ⌈m·N⌉ of them, drawn per (seed, round)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from raymtl.algorithms.training import derive_seed


def sample_size(fraction: float, num_clients: int) -> int:
    """⌈m·N⌉, from the decimal the user wrote for m: 0.28 of 25 clients is 7, where the
    float product (7.000000000000001) would round up to 8. At least one client."""
    exact = Fraction(repr(float(fraction))) * num_clients
    return min(num_clients, max(1, math.ceil(exact)))


def sample_clients(seed: int, round_index: int, num_clients: int, fraction: float) -> tuple:
    """⌈m·N⌉ clients uniformly without replacement, seeded by (seed, round)."""
    count = sample_size(fraction, num_clients)
    rng = np.random.default_rng(derive_seed(seed, round_index, "sample"))
    return tuple(sorted(int(i) for i in rng.choice(num_clients, size=count, replace=False)))
