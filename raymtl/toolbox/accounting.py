"""Privacy accounting of docs/ALGORITHMS.md §9.3: ε at δ from Google's `dp_accounting`
library (its RDP accountant, `dp_accounting.rdp.RdpAccountant`), never a hand-written formula.

What is composed, per kind of guarantee:

* Central client-level DP (`central_epsilon`), one release a round, σ the noise multiplier
  of the clipped sum (noise std σ·C, add/remove sensitivity C):
  - "poisson": `SelfComposedDpEvent(PoissonSampledDpEvent(q = m/N, GaussianDpEvent(σ)),
    rounds)` under add/remove-one neighbours (`NeighboringRelation.ADD_OR_REMOVE_ONE`), the
    convention of Opacus and TFF. Exact when clients are Poisson-sampled at rate q; an
    approximation for raymtl's fixed-size cohorts, which the label says.
  - "without_replacement": `SelfComposedDpEvent(SampledWithoutReplacementDpEvent(N, m,
    GaussianDpEvent(σ/2)), rounds)` under replace-one neighbours
    (`NeighboringRelation.REPLACE_ONE`, the only relation the library accounts this event
    under): replacing one client moves the clipped sum by up to 2C, so the library's noise
    multiplier (std / sensitivity) is σ/2; ε is several times larger.
  With adaptive clipping the caller passes σ itself: σ_Δ and the count's σ_b together spend
  what σ alone would (Andrew et al. 2021).
* Local DP (`local_epsilon`): each client's own Gaussian releases, sensitivity 2C under
  replace-one, `SelfComposedDpEvent(GaussianDpEvent(σ/2), releases)`, no amplification by
  sampling.
* Sample-level DP-SGD (`sample_level_epsilon`, Abadi et al. 2016): a client's steps,
  `SelfComposedDpEvent(PoissonSampledDpEvent(q = batch/n, GaussianDpEvent(σ_s)), steps)`
  under add/remove-one: the model of Opacus's own RDP accountant, computed here by
  dp_accounting (its orders differ slightly from Opacus's, so the two ε differ in the last
  digits). A loop of shuffled fixed-size batches is, again, approximated by Poisson.

Cost: the RDP curve of one round (one release, one step) is computed once per (σ, q, N,
relation) and cached; ε after r rounds is then `dp_accounting.rdp.compute_epsilon` of r
times that curve, which is exactly what the accountant's own `SelfComposedDpEvent(·, r)`
computes (count × curve), so the driver may ask every round.
"""

from __future__ import annotations

import functools
import logging
import math

import dp_accounting
import numpy as np
from dp_accounting import rdp

__all__ = [
    "ACCOUNTINGS",
    "LOCAL_ACCOUNTING",
    "SAMPLE_LEVEL_ACCOUNTING",
    "accounting_name",
    "central_epsilon",
    "local_epsilon",
    "rounds_within",
    "sample_level_epsilon",
]

NeighborRel = dp_accounting.NeighboringRelation

ACCOUNTINGS = {
    "poisson": "rdp/poisson(q=m/N, add-remove-one)",
    "without_replacement": "rdp/without-replacement(replace-one, σ/2)",
}
LOCAL_ACCOUNTING = "rdp/gaussian(replace-one, σ/2, no amplification)"
SAMPLE_LEVEL_ACCOUNTING = "rdp/poisson(q=batch/n, add-remove-one)"


def accounting_name(accounting: str) -> str:
    """The label written into the outputs for `privacy.accounting`."""
    try:
        return ACCOUNTINGS[accounting]
    except KeyError:
        raise ValueError(
            f"privacy.accounting: {accounting!r} is not one of {sorted(ACCOUNTINGS)}"
        ) from None


@functools.lru_cache(maxsize=512)
def _one_release(event: dp_accounting.DpEvent, relation: NeighborRel) -> tuple:
    """The library's RDP curve (orders, ε_α) of one `event` under `relation`, cached."""
    accountant = rdp.RdpAccountant(neighboring_relation=relation)
    # dp-accounting logs (absl) each order whose series does not converge, dropped from the
    # bound (still a valid ε): one line per order on the console, kept out of it here.
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant.compose(event)
    finally:
        absl.setLevel(level)
    return tuple(accountant.orders), tuple(accountant.rdp)


def _epsilon(event: dp_accounting.DpEvent, relation: NeighborRel, count: int, delta) -> float:
    """ε at δ of `event` composed `count` times: count × the cached one-event curve."""
    orders, curve = _one_release(event, relation)
    return float(rdp.compute_epsilon(np.array(orders), count * np.array(curve), delta)[0])


def _check(noise_multiplier: float, count: int, delta: float, what: str) -> None:
    if not noise_multiplier >= 0:
        raise ValueError(f"privacy: the noise multiplier must be ≥ 0 (got {noise_multiplier})")
    if count < 0:
        raise ValueError(f"privacy: the {what} must be ≥ 0 (got {count})")
    if not 0 < delta < 1:
        raise ValueError(f"privacy.delta: must lie in (0, 1) (got {delta})")


def _central_event(
    noise_multiplier: float, cohort: int, population: int, accounting: str
) -> tuple[dp_accounting.DpEvent, NeighborRel]:
    accounting_name(accounting)
    if not 1 <= cohort <= population:
        raise ValueError(
            f"privacy: the cohort must lie in [1, N] (cohort = {cohort}, N = {population})"
        )
    if accounting == "poisson":
        event = dp_accounting.PoissonSampledDpEvent(
            cohort / population, dp_accounting.GaussianDpEvent(noise_multiplier)
        )
        return event, NeighborRel.ADD_OR_REMOVE_ONE
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        population, cohort, dp_accounting.GaussianDpEvent(noise_multiplier / 2)
    )
    return event, NeighborRel.REPLACE_ONE


def central_epsilon(
    noise_multiplier: float,
    cohort: int,
    population: int,
    rounds: int,
    delta: float,
    accounting: str = "poisson",
) -> float:
    """ε at δ of `rounds` rounds of the sampled Gaussian mechanism (cohort m of N clients,
    noise multiplier σ), by `accounting` ("poisson" or "without_replacement", see the module
    docstring). σ = 0 gives inf (for rounds ≥ 1); rounds = 0 gives 0.0."""
    _check(noise_multiplier, rounds, delta, "rounds")
    event, relation = _central_event(noise_multiplier, cohort, population, accounting)
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    return _epsilon(event, relation, rounds, delta)


def rounds_within(
    target_epsilon: float,
    noise_multiplier: float,
    cohort: int,
    population: int,
    delta: float,
    accounting: str,
    max_rounds: int,
) -> int:
    """The most rounds r ∈ [0, max_rounds] with central_epsilon(r) ≤ target_epsilon (ε grows
    with r: binary search), for the message that refuses a longer run."""
    if max_rounds < 0:
        raise ValueError(f"privacy: max_rounds must be ≥ 0 (got {max_rounds})")

    def within(rounds: int) -> bool:
        epsilon = central_epsilon(noise_multiplier, cohort, population, rounds, delta, accounting)
        return epsilon <= target_epsilon

    if within(max_rounds):
        return max_rounds
    if not within(0):
        return 0
    low, high = 0, max_rounds  # within(low), not within(high)
    while high - low > 1:
        middle = (low + high) // 2
        if within(middle):
            low = middle
        else:
            high = middle
    return low


def local_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """ε at δ of a client's own `releases` Gaussian releases (local DP): sensitivity 2C under
    replace-one, so GaussianDpEvent(σ/2) composed `releases` times, no amplification.
    σ = 0 gives inf (for releases ≥ 1); releases = 0 gives 0.0."""
    _check(noise_multiplier, releases, delta, "releases")
    if releases == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    event = dp_accounting.GaussianDpEvent(noise_multiplier / 2)
    return _epsilon(event, NeighborRel.REPLACE_ONE, releases, delta)


def sample_level_epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float
) -> float:
    """ε at δ of `steps` DP-SGD steps (Poisson rate q = batch/n, noise multiplier σ_s) under
    add/remove-one, by dp_accounting's RDP accountant. σ_s = 0 gives inf (for steps ≥ 1);
    steps = 0 gives 0.0."""
    _check(noise_multiplier, steps, delta, "steps")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"privacy: the sample rate must lie in (0, 1] (got {sample_rate})")
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    event = dp_accounting.PoissonSampledDpEvent(
        sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
    )
    return _epsilon(event, NeighborRel.ADD_OR_REMOVE_ONE, steps, delta)
