"""The aggregation rules of docs/ALGORITHMS.md §9.1: how an averaging step (the server, an LPS,
a leader) combines the models x_1 … x_m it receives, coordinate by coordinate unless a rule
says otherwise. The rules act on the models x_k = w_k; since w_t is common to all of them,
acting on the updates Δ_k = w_k − w_t gives the same result shifted by w_t, and the same
distances between them.

    mean, weights samples       Σ_k n_k·x_k / Σ_k n_k                (FedAvg; None if Σ n_k ≤ 0)
    mean, weights uniform       (1/m)·Σ_k x_k
    median                      per coordinate the median of the m values; for an even m the
                                mean of the two middle ones (numpy's rule)
    trimmed_mean, β ∈ [0, ½)    per coordinate drop the b = ⌊β·m⌋ largest and the b smallest
                                values, take the plain mean of the m − 2b left
    krum, f Byzantine           score(k) = Σ of the squared L2 distances from x_k to its
                                m − f − 2 nearest other models; keep the model of lowest score
    multi_krum, f, M            keep the M lowest scores (M = m − f by default), average them

Median and trimmed mean: Yin, Chen, Ramchandran, Bartlett 2018, "Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates" (coordinate-wise median, coordinate-wise
β-trimmed mean). Krum and Multi-Krum: Blanchard, El Mhamdi, Guerraoui, Stainer 2017,
"Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent"; the scores are over
the whole update vector (every float tensor flattened and concatenated in the first model's
name order) and need m ≥ 2f + 3, so that every model has m − f − 2 ≥ f + 1 neighbours.

Details that fix the floats:
* Ties in the Krum scores go to the lowest index in the caller's order; Multi-Krum sums the
  kept models in the caller's order (not the score order), so its mean does not depend on
  the scores' float noise.
* Multi-Krum takes the plain mean of the kept models (Blanchard et al.: a self-reported n_k
  must not let a kept Byzantine client dominate) unless the experiment file sets
  `weights: samples` explicitly, which gives Flower's sample-weighted variant. Since
  `AggregationSettings.weights` defaults to `samples` for the mean, only a value the user
  wrote (pydantic's `model_fields_set`) switches Multi-Krum to the sample weights.
* ⌊β·m⌋ is taken from the decimal the user wrote: 0.29 of 100 is 29, where the float
  product 28.999999999999996 would floor to 28 (and 0.07 of 100 is 7).
* A tensor that is not floating point (a batch-norm counter) ignores the rule: it gets the
  plain mean rounded down, ⌊Σ_k x_k / m⌋, in its own dtype.
* Everything is computed in the tensors' dtype on their device, except the Krum distances,
  which are float64 on that device.

The caller has already ordered the models (by sender) and dropped the non-finite ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction

import torch

from raymtl.toolbox.settings import AggregationSettings

Tensors = dict[str, torch.Tensor]
Update = tuple[Tensors, float]
Rule = Callable[[Sequence[Update], list[str], AggregationSettings], "Tensors | None"]


def combine(updates: Sequence[Update], settings: AggregationSettings) -> Tensors | None:
    """The models (with their sample counts n_k) combined by `settings.rule`, one tensor per
    name of the first model; None when there is none, when the sample weights sum to ≤ 0, or
    when Krum's m ≥ 2f + 3 fails (`krum_refusal` says why)."""
    if not updates:
        return None
    names = list(updates[0][0])
    float_names = [name for name in names if updates[0][0][name].is_floating_point()]
    combined = RULE_FUNCTIONS[settings.rule](updates, float_names, settings)
    if combined is None:
        return None
    return {
        name: combined[name] if name in combined else floor_mean(updates, name) for name in names
    }


def krum_refusal(m: int, f: int) -> str | None:
    """Why Krum cannot run on m models with f Byzantine ones assumed, or None when it can."""
    needed = 2 * f + 3
    if m < needed:
        return f"krum needs m ≥ 2f + 3 = {needed} models (f = {f}), got {m}"
    return None


def flatten(tensors: Tensors, names: Iterable[str]) -> torch.Tensor:
    """The tensors of `names`, flattened and concatenated in that order, as float64 (on the
    tensors' device): the vector Krum measures distances on."""
    return torch.cat([tensors[name].reshape(-1).to(torch.float64) for name in names])


def krum_scores(vectors: torch.Tensor, f: int) -> torch.Tensor:
    """score(k) = Σ of the squared L2 distances from row k of `vectors` [m, d] to its
    m − f − 2 nearest other rows; a float64 tensor [m] on the vectors' device."""
    m = vectors.shape[0]
    refusal = krum_refusal(m, f)
    if refusal is not None:
        raise ValueError(refusal)
    vectors = vectors.to(torch.float64)
    # Row by row, as Σ (x_i − x_j)²: exact differences, where torch.cdist's ‖x‖² + ‖y‖² − 2x·y
    # cancels badly for nearby models (which is what Krum must rank).
    squared = torch.stack([((vectors - vectors[k]) ** 2).sum(dim=1) for k in range(m)])
    squared.fill_diagonal_(math.inf)  # a model is not its own neighbour
    nearest = squared.sort(dim=1).values[:, : m - f - 2]
    return nearest.sum(dim=1)


def krum_select(vectors: torch.Tensor, f: int, keep: int) -> list[int]:
    """The indices of the `keep` rows of lowest Krum score, sorted by (score, index)."""
    scores = krum_scores(vectors, f).tolist()
    return sorted(range(len(scores)), key=lambda k: (scores[k], k))[:keep]


def floor_mean(updates: Sequence[Update], name: str) -> torch.Tensor:
    """⌊Σ_k x_k / m⌋ in the tensor's own dtype: the rule for integer buffers."""
    values = torch.stack([tensors[name] for tensors, _ in updates])
    total = values.sum(dim=0)
    return torch.div(total, len(updates), rounding_mode="floor").to(values.dtype)


def weighted_sum(updates: Sequence[Update], names: list[str], total: float) -> Tensors:
    """Σ_k (w_k/total)·x_k summed in the order given: the formula of
    raymtl.algorithms.aggregate.weighted_sum, so the FedAvg mean is bitwise the same."""
    return {
        name: sum(tensors[name] * (weight / total) for tensors, weight in updates) for name in names
    }


def sample_mean(updates: Sequence[Update], names: list[str]) -> Tensors | None:
    total = sum(weight for _, weight in updates)
    if total <= 0:
        return None
    return weighted_sum(updates, names, total)


def uniform_mean(updates: Sequence[Update], names: list[str]) -> Tensors:
    return weighted_sum([(tensors, 1.0) for tensors, _ in updates], names, float(len(updates)))


def _mean(updates: Sequence[Update], names: list[str], settings: AggregationSettings):
    if settings.weights == "uniform":
        return uniform_mean(updates, names)
    return sample_mean(updates, names)


def _sorted_values(updates: Sequence[Update], name: str) -> torch.Tensor:
    """The m values of every coordinate of `name`, sorted along a new first dimension."""
    return torch.stack([tensors[name] for tensors, _ in updates]).sort(dim=0).values


def _median(updates: Sequence[Update], names: list[str], settings: AggregationSettings):
    m = len(updates)
    combined = {}
    for name in names:
        values = _sorted_values(updates, name)
        if m % 2:
            combined[name] = values[m // 2]
        else:
            # numpy's rule; torch.median would return the lower of the two middle values.
            combined[name] = (values[m // 2 - 1] + values[m // 2]) / 2
    return combined


def trimmed_count(beta: float, m: int) -> int:
    """b = ⌊β·m⌋ from the decimal the user wrote for β (0.07 of 100 is 7 exactly)."""
    return math.floor(Fraction(repr(float(beta))) * m)


def _trimmed_mean(updates: Sequence[Update], names: list[str], settings: AggregationSettings):
    m = len(updates)
    trimmed = trimmed_count(settings.beta, m)
    return {
        name: _sorted_values(updates, name)[trimmed : m - trimmed].mean(dim=0) for name in names
    }


def _krum_order(
    updates: Sequence[Update], names: list[str], settings: AggregationSettings, keep: int
) -> list[int] | None:
    if krum_refusal(len(updates), settings.f) is not None:
        return None
    vectors = torch.stack([flatten(tensors, names) for tensors, _ in updates])
    return krum_select(vectors, settings.f, keep)


def _krum(updates: Sequence[Update], names: list[str], settings: AggregationSettings):
    chosen = _krum_order(updates, names, settings, keep=1)
    if chosen is None:
        return None
    model = updates[chosen[0]][0]
    # Copies, so the aggregate never aliases a client's message.
    return {name: model[name].clone() for name in names}


def _multi_krum(updates: Sequence[Update], names: list[str], settings: AggregationSettings):
    m = len(updates)
    keep = min(m, settings.keep if settings.keep is not None else m - settings.f)
    kept = _krum_order(updates, names, settings, keep)
    if kept is None:
        return None
    # Summed in the caller's order, whatever the scores' order.
    kept_updates = [updates[k] for k in sorted(kept)]
    if settings.weights == "samples" and "weights" in settings.model_fields_set:
        return sample_mean(kept_updates, names)
    return uniform_mean(kept_updates, names)


RULE_FUNCTIONS: dict[str, Rule] = {
    "mean": _mean,
    "median": _median,
    "trimmed_mean": _trimmed_mean,
    "krum": _krum,
    "multi_krum": _multi_krum,
}
