"""Figures over seeds, and the rows of rounds.parquet they are read from.

The bottom of the metrics package: summaries, per-task figures, Δ% and the table reporters
all use these, and this module imports none of them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def evaluated_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """Rows of rounds where evaluation happened: those that timed an evaluation
    (`seconds_evaluate`), or, in runs recorded before it, those with a loss (non-eval rounds
    carry NaN in both). A round whose loss turned NaN (a diverged run) was evaluated too.

    The loss, not the accuracy: a federation of regression tasks has no accuracy.
    """
    evaluated = rounds["mean_loss"].notna()
    if "seconds_evaluate" in rounds:
        evaluated |= rounds["seconds_evaluate"].notna()
    return rounds[evaluated]


def is_number(value) -> bool:
    """True for a finite float (not None, NaN or ±inf)."""
    return value is not None and math.isfinite(value)


def mean_and_std(values: list[float | None]) -> dict[str, float]:
    """Mean and population std (ddof=0, so a single seed gives std 0, not NaN) over seeds,
    over the values that are not None or NaN (a diverged seed's accuracy); NaN when none is."""
    kept = [value for value in values if value is not None and not math.isnan(value)]
    if not kept:
        return {"mean": math.nan, "std": math.nan}
    array = np.asarray(kept, dtype=float)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=0))}


def without_nan(value):
    """`value` (dicts, lists, tuples of numbers) with every float NaN replaced by None, so
    that json.dumps writes null, not the bare NaN no JSON reader accepts. ±inf stays
    (Infinity: an ε without noise)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_nan(item) for item in value]
    return value


def adjusted_rand_score(labels_true, labels_pred) -> float:
    """scikit-learn's adjusted Rand index of two labellings. Imported when first scored:
    sklearn.metrics takes 0.6 s to import, which every `raymtl` command would pay."""
    from sklearn.metrics import adjusted_rand_score as ari

    return float(ari(labels_true, labels_pred))
