"""Fairness statistics over per-client accuracies.

Definitions (N = number of clients):

* ``mean``    -- arithmetic mean of the accuracies.
* ``worst10`` -- mean of the ``ceil(0.1 * N)`` lowest accuracies (at least one client).
* ``worst20`` -- mean of the ``ceil(0.2 * N)`` lowest accuracies (at least one client).
* ``std``     -- population standard deviation (ddof=0) across clients.

An empty input gives NaN for every statistic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Guards ceil() against float noise: 0.1 * 30 == 3.0000000000000004 must count 3 clients, not 4.
_CEIL_TOLERANCE = 1e-9


def worst_fraction_count(fraction: float, n_clients: int) -> int:
    """Number of clients in the worst ``fraction``: ceil(fraction * N), at least 1."""
    return max(1, math.ceil(fraction * n_clients - _CEIL_TOLERANCE))


def worst_fraction_mean(sorted_accuracies: np.ndarray, fraction: float) -> float:
    """Mean of the lowest ``ceil(fraction * N)`` entries of an ascending-sorted array."""
    count = worst_fraction_count(fraction, len(sorted_accuracies))
    return float(sorted_accuracies[:count].mean())


def fairness_stats(accuracies: Sequence[float]) -> dict[str, float]:
    """Return ``{"mean", "worst10", "worst20", "std"}`` of per-client accuracies."""
    values = np.sort(np.asarray(accuracies, dtype=float))
    if values.size == 0:
        return {"mean": math.nan, "worst10": math.nan, "worst20": math.nan, "std": math.nan}
    return {
        "mean": float(values.mean()),
        "worst10": worst_fraction_mean(values, 0.1),
        "worst20": worst_fraction_mean(values, 0.2),
        "std": float(values.std(ddof=0)),
    }
