"""Which clients take part in a round: ⌈m·N⌉ of them, drawn per (seed, round)."""

from __future__ import annotations

import numpy as np

from raymtl.algorithms.training import derive_seed, sample_size


def sample_clients(
    seed: int, round_index: int, num_clients: int, fraction: float, sampling: str = "uniform"
) -> tuple:
    """⌈m·N⌉ clients uniformly without replacement, seeded by (seed, round); with `sampling`
    "poisson", each client independently with probability m (a cohort of varying size, maybe
    empty: what DP's Poisson accounting assumes)."""
    if sampling == "poisson":
        rng = np.random.default_rng(derive_seed(seed, round_index, "poisson-sample"))
        return tuple(int(i) for i in np.flatnonzero(rng.random(num_clients) < fraction))
    count = sample_size(fraction, num_clients)
    rng = np.random.default_rng(derive_seed(seed, round_index, "sample"))
    return tuple(sorted(int(i) for i in rng.choice(num_clients, size=count, replace=False)))


def evaluation_sample(
    seed: int, round_index: int, num_clients: int, fraction: float
) -> tuple[int, ...] | None:
    """The clients evaluated after round `round_index` with `eval_fraction` < 1: ⌈f·N⌉ of
    them, seeded by (seed, round) apart from the training cohort; None: every client."""
    if fraction >= 1:
        return None
    count = sample_size(fraction, num_clients)
    rng = np.random.default_rng(derive_seed(seed, round_index, "evaluation-sample"))
    return tuple(sorted(int(i) for i in rng.choice(num_clients, size=count, replace=False)))
