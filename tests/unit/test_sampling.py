"""The sampled count is exactly ⌈m·N⌉ for the m the user wrote, not for its float product."""

from __future__ import annotations

import pytest

from raymtl.runtime.loop.sampling import sample_clients, sample_size


def test_every_two_decimal_fraction_of_up_to_200_clients_samples_ceil_m_n():
    wrong = [
        (hundredths, n)
        for n in range(1, 201)
        for hundredths in range(1, 101)
        # ⌈k·N/100⌉ in integers: the exact count
        if sample_size(hundredths / 100, n) != -(-hundredths * n // 100)
    ]
    assert wrong == []


def test_the_float_product_is_not_rounded_up():
    assert 0.28 * 25 > 7  # 7.000000000000001: math.ceil of it took 8
    assert sample_size(0.28, 25) == 7


@pytest.mark.parametrize(("fraction", "expected"), [(0.28, 7), (0.01, 1), (1.0, 25), (0.5, 13)])
def test_the_sample_has_that_many_distinct_clients_and_depends_on_seed_and_round(
    fraction, expected
):
    chosen = sample_clients(0, 3, 25, fraction)
    assert len(chosen) == len(set(chosen)) == expected
    assert list(chosen) == sorted(chosen) and all(0 <= i < 25 for i in chosen)
    assert sample_clients(0, 3, 25, fraction) == chosen  # seeded by (seed, round)
    if expected < 25:
        others = {sample_clients(seed, t, 25, fraction) for seed in (0, 1) for t in (1, 2, 3)}
        assert len(others) > 1


def test_poisson_sampling_takes_each_client_with_probability_m():
    """sampling: poisson — each client independently with probability m: cohorts of varying
    size (DP's poisson accounting is then exact), seeded by (seed, round)."""
    from raymtl.runtime.loop.sampling import sample_clients

    cohorts = [sample_clients(0, t, 1000, 0.1, "poisson") for t in range(1, 51)]
    sizes = [len(c) for c in cohorts]
    assert len(set(sizes)) > 1  # sizes vary
    assert sum(sizes) / len(sizes) == pytest.approx(100, rel=0.05)  # E|S_t| = q·N
    assert cohorts[0] == sample_clients(0, 1, 1000, 0.1, "poisson")  # seeded
    assert all(list(c) == sorted(set(c)) for c in cohorts)
