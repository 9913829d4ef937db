"""raymtl.toolbox.accounting: ε equals dp_accounting's own value, computed here directly."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

from raymtl.toolbox.accounting import (
    accounting_name,
    central_epsilon,
    local_epsilon,
    rounds_within,
    sample_level_epsilon,
)

Rel = dp_accounting.NeighboringRelation


def library_poisson(sigma, q, rounds, delta):
    accountant = RdpAccountant(neighboring_relation=Rel.ADD_OR_REMOVE_ONE)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return accountant.get_epsilon(delta)


def library_without_replacement(sigma, cohort, population, rounds, delta):
    accountant = RdpAccountant(neighboring_relation=Rel.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        population, cohort, dp_accounting.GaussianDpEvent(sigma / 2)
    )
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(
    ("sigma", "cohort", "population", "rounds", "delta"),
    [(1.0, 10, 100, 50, 1e-5), (0.8, 20, 1000, 300, 1e-6), (2.0, 7, 7, 12, 1e-3)],
)
def test_poisson_equals_the_library(sigma, cohort, population, rounds, delta):
    ours = central_epsilon(sigma, cohort, population, rounds, delta, "poisson")
    theirs = library_poisson(sigma, cohort / population, rounds, delta)
    assert ours == pytest.approx(theirs, rel=1e-12)
    assert 0 < ours < math.inf


@pytest.mark.parametrize(
    ("sigma", "cohort", "population", "rounds", "delta"),
    [(1.0, 10, 100, 50, 1e-5), (3.0, 5, 50, 20, 1e-4), (2.0, 7, 7, 12, 1e-3)],
)
def test_without_replacement_equals_the_library(sigma, cohort, population, rounds, delta):
    ours = central_epsilon(sigma, cohort, population, rounds, delta, "without_replacement")
    theirs = library_without_replacement(sigma, cohort, population, rounds, delta)
    assert ours == pytest.approx(theirs, rel=1e-12)
    # Replace-one at σ/2 spends more than add/remove-one at σ.
    assert ours > central_epsilon(sigma, cohort, population, rounds, delta, "poisson")


def test_full_participation_is_the_plain_gaussian():
    # q = 1: no amplification, the same as composing the Gaussian mechanism itself.
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(1.5), 10)
    assert central_epsilon(1.5, 40, 40, 10, 1e-5) == pytest.approx(
        accountant.get_epsilon(1e-5), rel=1e-12
    )


def test_edge_cases():
    assert central_epsilon(0.0, 10, 100, 5, 1e-5) == math.inf
    assert central_epsilon(0.0, 10, 100, 5, 1e-5, "without_replacement") == math.inf
    assert central_epsilon(1.0, 10, 100, 0, 1e-5) == 0.0
    assert central_epsilon(0.0, 10, 100, 0, 1e-5) == 0.0
    with pytest.raises(ValueError, match="accounting"):
        central_epsilon(1.0, 10, 100, 5, 1e-5, "pld")
    with pytest.raises(ValueError, match="cohort"):
        central_epsilon(1.0, 101, 100, 5, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        central_epsilon(1.0, 10, 100, 5, 0.0)


def test_epsilon_grows_with_rounds_and_falls_with_noise():
    eps = [central_epsilon(1.0, 10, 100, r, 1e-5) for r in (1, 10, 100)]
    assert eps[0] < eps[1] < eps[2]
    assert central_epsilon(2.0, 10, 100, 100, 1e-5) < eps[2]


def test_accounting_names():
    assert accounting_name("poisson") == "rdp/poisson(q=m/N, add-remove-one)"
    assert accounting_name("without_replacement") == "rdp/without-replacement(replace-one, σ/2)"
    with pytest.raises(ValueError, match="privacy.accounting"):
        accounting_name("nope")


def test_local_epsilon_equals_the_library():
    accountant = RdpAccountant(neighboring_relation=Rel.REPLACE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 7))
    assert local_epsilon(4.0, 7, 1e-5) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    assert local_epsilon(4.0, 0, 1e-5) == 0.0
    assert local_epsilon(0.0, 3, 1e-5) == math.inf
    assert local_epsilon(4.0, 8, 1e-5) > local_epsilon(4.0, 7, 1e-5)


def test_sample_level_epsilon_equals_the_library_and_agrees_with_opacus():
    ours = sample_level_epsilon(1.1, 0.01, 1000, 1e-5)
    assert ours == pytest.approx(library_poisson(1.1, 0.01, 1000, 1e-5), rel=1e-12)
    # Opacus's RDP accountant: the same model, other RDP orders: close, not equal.
    from opacus.accountants import RDPAccountant

    opacus = RDPAccountant()
    opacus.history = [(1.1, 0.01, 1000)]
    assert ours == pytest.approx(opacus.get_epsilon(1e-5), rel=0.05)
    assert sample_level_epsilon(1.1, 0.01, 0, 1e-5) == 0.0
    assert sample_level_epsilon(0.0, 0.01, 5, 1e-5) == math.inf
    with pytest.raises(ValueError, match="sample rate"):
        sample_level_epsilon(1.0, 0.0, 5, 1e-5)


@pytest.mark.parametrize(
    ("accounting", "target"), [("poisson", 4.0), ("without_replacement", 30.0)]
)
def test_rounds_within_is_the_last_round_under_the_target(accounting, target):
    rounds = rounds_within(target, 1.0, 10, 100, 1e-5, accounting, 10_000)
    assert 0 < rounds < 10_000
    assert central_epsilon(1.0, 10, 100, rounds, 1e-5, accounting) <= target
    assert central_epsilon(1.0, 10, 100, rounds + 1, 1e-5, accounting) > target


def test_rounds_within_bounds():
    assert rounds_within(1e6, 1.0, 10, 100, 1e-5, "poisson", 50) == 50
    assert rounds_within(1e-9, 1.0, 10, 100, 1e-5, "poisson", 50) == 0
    assert rounds_within(10.0, 0.0, 10, 100, 1e-5, "poisson", 50) == 0
    assert rounds_within(10.0, 1.0, 10, 100, 1e-5, "poisson", 0) == 0
