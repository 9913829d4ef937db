"""The aggregation rules of raymtl.toolbox.rules (docs/ALGORITHMS.md §9.1) on hand-computed
examples, and Krum against a plain-Python reimplementation of Blanchard et al.'s score."""

from __future__ import annotations

import random

import pytest
import torch

from raymtl.algorithms.aggregate import weighted_average
from raymtl.toolbox.rules import (
    RULE_FUNCTIONS,
    combine,
    flatten,
    krum_refusal,
    krum_scores,
    krum_select,
    trimmed_count,
)
from raymtl.toolbox.settings import RULES, AggregationSettings


def models(*coordinates: tuple[float, float]) -> list[tuple[dict[str, torch.Tensor], float]]:
    """One model a pair of coordinates, every client with one sample."""
    return [({"w": torch.tensor(pair, dtype=torch.float64)}, 1.0) for pair in coordinates]


def test_every_rule_has_a_function():
    assert set(RULE_FUNCTIONS) == set(RULES)


def test_no_model_gives_none():
    for rule in RULES:
        assert combine([], AggregationSettings(rule=rule)) is None


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values():
    # coordinate 0: 10, 1, 4, 2 -> sorted 1, 2, 4, 10 -> (2 + 4)/2 = 3 (torch.median: 2)
    # coordinate 1: -1, 5, 0, 3 -> sorted -1, 0, 3, 5 -> (0 + 3)/2 = 1.5
    updates = models((10, -1), (1, 5), (4, 0), (2, 3))
    combined = combine(updates, AggregationSettings(rule="median"))
    assert combined["w"].tolist() == [3.0, 1.5]


def test_median_of_an_odd_count_is_the_middle_value():
    # coordinate 0: 7, 1, 3 -> 1, 3, 7 -> 3; coordinate 1: 0, -2, 9 -> -2, 0, 9 -> 0
    updates = models((7, 0), (1, -2), (3, 9))
    combined = combine(updates, AggregationSettings(rule="median"))
    assert combined["w"].tolist() == [3.0, 0.0]


@pytest.mark.parametrize(
    ("beta", "m", "expected"),
    [
        (0.25, 4, 1),  # 0.25·4 = 1
        (0.07, 100, 7),  # 7 exactly
        (0.29, 100, 29),  # the float product is 28.999999999999996: floor would give 28
        (0.1, 9, 0),  # 0.9
        (0.0, 5, 0),
        (0.49, 100, 49),
    ],
)
def test_trimmed_count_takes_the_decimal_exactly(beta, m, expected):
    assert trimmed_count(beta, m) == expected


def test_trimmed_mean_drops_b_values_at_each_end():
    # β = 0.25, m = 4 -> b = 1
    # coordinate 0: 10, 1, 4, 2 -> drop 1 and 10 -> (2 + 4)/2 = 3
    # coordinate 1: -1, 5, 0, 3 -> drop -1 and 5 -> (0 + 3)/2 = 1.5
    updates = models((10, -1), (1, 5), (4, 0), (2, 3))
    combined = combine(updates, AggregationSettings(rule="trimmed_mean", beta=0.25))
    assert combined["w"].tolist() == [3.0, 1.5]


def test_trimmed_mean_of_five_with_one_dropped_at_each_end():
    # β = 0.2, m = 5 -> b = 1
    # coordinate 0: 100, 1, 2, 3, -50 -> drop -50 and 100 -> (1 + 2 + 3)/3 = 2
    # coordinate 1: 0, 0, 6, 0, 0 -> drop one 0 and the 6 -> (0 + 0 + 0)/3 = 0
    updates = models((100, 0), (1, 0), (2, 6), (3, 0), (-50, 0))
    combined = combine(updates, AggregationSettings(rule="trimmed_mean", beta=0.2))
    assert combined["w"].tolist() == [2.0, 0.0]


def test_trimmed_mean_with_beta_zero_is_the_plain_mean():
    # (1 + 3 + 8)/3 = 4, (2 + 4 + 0)/3 = 2
    updates = models((1, 2), (3, 4), (8, 0))
    combined = combine(updates, AggregationSettings(rule="trimmed_mean", beta=0.0))
    assert combined["w"].tolist() == [4.0, 2.0]


def test_sample_mean_by_hand():
    # weights 1 and 3: (1·1 + 3·3)/4 = 2.5, (1·2 + 3·4)/4 = 3.5
    updates = [
        ({"w": torch.tensor([1.0, 2.0])}, 1.0),
        ({"w": torch.tensor([3.0, 4.0])}, 3.0),
    ]
    combined = combine(updates, AggregationSettings())
    assert combined["w"].tolist() == [2.5, 3.5]


def test_sample_mean_is_bitwise_weighted_average():
    generator = torch.Generator().manual_seed(3)
    updates = [
        (
            {
                "conv.weight": torch.randn(4, 3, 3, generator=generator),
                "fc.bias": torch.randn(7, generator=generator),
            },
            samples,
        )
        for samples in (3.0, 1.0, 7.5, 11.0, 0.25)
    ]
    combined = combine(updates, AggregationSettings(rule="mean", weights="samples"))
    reference = weighted_average(updates)
    assert list(combined) == list(reference)
    for name in reference:
        assert torch.equal(combined[name], reference[name])


def test_sample_mean_of_no_samples_is_none():
    updates = [({"w": torch.tensor([1.0])}, 0.0), ({"w": torch.tensor([2.0])}, 0.0)]
    assert combine(updates, AggregationSettings()) is None


def test_uniform_mean_ignores_the_samples():
    # (1 + 3 + 8)/3 = 4, (2 + 4 + 0)/3 = 2, whatever the counts 1, 100, 5
    updates = [
        ({"w": torch.tensor([1.0, 2.0])}, 1.0),
        ({"w": torch.tensor([3.0, 4.0])}, 100.0),
        ({"w": torch.tensor([8.0, 0.0])}, 5.0),
    ]
    combined = combine(updates, AggregationSettings(weights="uniform"))
    assert combined["w"].tolist() == [4.0, 2.0]


def test_integer_buffers_take_the_plain_mean_rounded_down():
    # counters 3 and 4 -> ⌊7/2⌋ = 3; -3 and -4 -> ⌊-7/2⌋ = -4 (down, not towards 0)
    updates = [
        ({"w": torch.tensor([1.0]), "count": torch.tensor([3, -3])}, 1.0),
        ({"w": torch.tensor([2.0]), "count": torch.tensor([4, -4])}, 9.0),
    ]
    for rule in ("mean", "median", "trimmed_mean"):
        combined = combine(updates, AggregationSettings(rule=rule))
        assert combined["count"].tolist() == [3, -4]
        assert combined["count"].dtype == torch.int64
    # the float tensor follows the rule: samples (1·1 + 9·2)/10 = 1.9, median (1 + 2)/2
    assert combine(updates, AggregationSettings())["w"].item() == pytest.approx(1.9)
    assert combine(updates, AggregationSettings(rule="median"))["w"].item() == 1.5


# Krum: five one-coordinate models 0, 1, 2, 3, 100 held twice (as "weight" and "bias", so the
# update vector is [x, x] and each squared distance is 2·(x_i − x_j)²). m = 5, f = 1: each
# score sums the m − f − 2 = 2 nearest others.
#   x=0:   to 1, 2 -> 2·(1 + 4) = 10
#   x=1:   to 0, 2 -> 2·(1 + 1) = 4
#   x=2:   to 1, 3 -> 2·(1 + 1) = 4
#   x=3:   to 2, 1 -> 2·(1 + 4) = 10
#   x=100: to 3, 2 -> 2·(97² + 98²) = 2·(9409 + 9604) = 38026
KRUM_POINTS = (0.0, 1.0, 2.0, 3.0, 100.0)
KRUM_SAMPLES = (1.0, 1.0, 1.0, 5.0, 100.0)


def krum_models():
    return [
        ({"weight": torch.tensor([x]), "bias": torch.tensor([x])}, samples)
        for x, samples in zip(KRUM_POINTS, KRUM_SAMPLES, strict=True)
    ]


def test_krum_scores_by_hand():
    vectors = torch.stack([flatten(tensors, ["weight", "bias"]) for tensors, _ in krum_models()])
    assert vectors.dtype == torch.float64
    assert krum_scores(vectors, f=1).tolist() == [10.0, 4.0, 4.0, 10.0, 38026.0]
    # sorted by (score, index): 4 (1), 4 (2), 10 (0), 10 (3), 38026 (4)
    assert krum_select(vectors, f=1, keep=5) == [1, 2, 0, 3, 4]


def test_krum_returns_the_lowest_score_model_itself_ties_to_the_lowest_index():
    updates = krum_models()
    combined = combine(updates, AggregationSettings(rule="krum", f=1))
    # models 1 and 2 tie at 4: model 1 is kept
    assert combined["weight"].tolist() == [1.0]
    assert combined["bias"].tolist() == [1.0]
    assert combined["weight"] is not updates[1][0]["weight"]  # a copy


def test_krum_tie_on_three_models():
    # m = 3, f = 0, one neighbour: -5, 1, -1 -> distances² 36 (0-1), 16 (0-2), 4 (1-2)
    # scores 16, 4, 4 -> models 1 and 2 tie, 1 kept
    vectors = torch.tensor([[-5.0], [1.0], [-1.0]])
    assert krum_scores(vectors, f=0).tolist() == [16.0, 4.0, 4.0]
    assert krum_select(vectors, f=0, keep=1) == [1]
    # identical models: all scores 0, the first is kept
    assert krum_select(torch.zeros(4, 3), f=0, keep=2) == [0, 1]


def test_multi_krum_takes_the_plain_mean_by_default():
    # M = m − f = 4 kept: models 1, 2, 0, 3 -> (0 + 1 + 2 + 3)/4 = 1.5 (100 is left out);
    # weights not written -> the plain mean, though AggregationSettings.weights is "samples"
    combined = combine(krum_models(), AggregationSettings(rule="multi_krum", f=1))
    assert combined["weight"].tolist() == [1.5]
    uniform = AggregationSettings(rule="multi_krum", f=1, weights="uniform")
    assert combine(krum_models(), uniform)["weight"].tolist() == [1.5]


def test_multi_krum_sample_weights_when_written():
    # kept 0, 1, 2, 3 with samples 1, 1, 1, 5: (0 + 1 + 2 + 5·3)/8 = 18/8 = 2.25
    settings = AggregationSettings(rule="multi_krum", f=1, weights="samples")
    assert combine(krum_models(), settings)["weight"].tolist() == [2.25]


def test_multi_krum_keep():
    # keep = 3: models 1, 2, 0 -> (0 + 1 + 2)/3 = 1
    settings = AggregationSettings(rule="multi_krum", f=1, keep=3)
    assert combine(krum_models(), settings)["weight"].tolist() == [1.0]


def test_krum_refusal():
    # needs m ≥ 2f + 3
    assert krum_refusal(5, 1) is None
    assert krum_refusal(3, 0) is None
    assert krum_refusal(4, 1) == "krum needs m ≥ 2f + 3 = 5 models (f = 1), got 4"
    assert krum_refusal(2, 0) is not None
    assert krum_refusal(6, 2) is not None
    four = krum_models()[:4]
    assert combine(four, AggregationSettings(rule="krum", f=1)) is None
    assert combine(four, AggregationSettings(rule="multi_krum", f=1)) is None
    with pytest.raises(ValueError, match="2f"):
        krum_scores(torch.zeros(4, 2), f=1)


def brute_force_krum(points: list[list[float]], f: int) -> int:
    """Blanchard et al.'s Krum in plain Python: the index of the lowest score, lowest first."""
    m = len(points)
    scores = []
    for i, x in enumerate(points):
        distances = sorted(
            sum((a - b) ** 2 for a, b in zip(x, y, strict=True))
            for j, y in enumerate(points)
            if j != i
        )
        scores.append(sum(distances[: m - f - 2]))
    return min(range(m), key=lambda k: (scores[k], k))


@pytest.mark.parametrize(
    ("seed", "m", "f"),
    [(0, 3, 0), (1, 5, 1), (2, 7, 2), (3, 9, 3), (4, 10, 2), (5, 12, 1), (6, 20, 5)],
)
def test_krum_matches_a_brute_force_reimplementation(seed, m, f):
    rng = random.Random(seed)
    points = [[rng.gauss(0, 1) for _ in range(6)] for _ in range(m)]
    # f outliers far away, as Byzantine clients would send
    for k in rng.sample(range(m), f):
        points[k] = [value * 50 for value in points[k]]
    updates = [
        (
            {
                "a": torch.tensor(point[:4], dtype=torch.float64).reshape(2, 2),
                "b": torch.tensor(point[4:], dtype=torch.float64),
            },
            1.0,
        )
        for point in points
    ]
    chosen = brute_force_krum(points, f)
    combined = combine(updates, AggregationSettings(rule="krum", f=f))
    assert torch.equal(combined["a"], updates[chosen][0]["a"])
    assert torch.equal(combined["b"], updates[chosen][0]["b"])
