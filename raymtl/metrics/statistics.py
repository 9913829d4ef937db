"""Figures over seeds, and the rows of rounds.parquet they are read from.

The bottom of the metrics package: summaries, per-task figures, Δ% and the table reporters
all use these, and this module imports none of them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def evaluated_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """Rows of rounds where evaluation happened (non-eval rounds carry NaN loss).

    The loss, not the accuracy: a federation of regression tasks has no accuracy.
    """
    return rounds.dropna(subset=["mean_loss"])


def mean_and_std(values: list[float]) -> dict[str, float]:
    """Mean and population std (ddof=0, so a single seed gives std 0, not NaN) over seeds."""
    if not values:
        return {"mean": math.nan, "std": math.nan}
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=0))}


def adjusted_rand_score(labels_true, labels_pred) -> float:
    """scikit-learn's adjusted Rand index of two labellings. Imported when first scored:
    sklearn.metrics takes 0.6 s to import, which every `raymtl` command would pay."""
    from sklearn.metrics import adjusted_rand_score as ari

    return float(ari(labels_true, labels_pred))
