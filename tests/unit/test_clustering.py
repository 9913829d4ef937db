"""One-shot clustering maths on hand-made Gram matrices, HAC of a hand-made R, and Φ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymtl.data import features
from raymtl.graph import clustering as hac


def eigen(x, k):
    gram = hac.gram_matrix(x)
    values, vectors = hac.top_eigenpairs(gram, k)
    return gram, values, vectors


def r_of(x_i, x_j, k=3):
    gram_i, values_i, _ = eigen(x_i, k)
    _, _, vectors_j = eigen(x_j, k)
    return hac.relevance(values_i, hac.projected_eigenvalues(gram_i, vectors_j))


def test_gram_matrix_is_features_t_features_over_n():
    x = np.array([[1.0, 2.0], [3.0, 0.0]])
    assert np.allclose(hac.gram_matrix(x), [[5.0, 1.0], [1.0, 2.0]])


def test_top_eigenpairs_are_the_k_largest_in_descending_order():
    values, vectors = hac.top_eigenpairs(np.diag([1.0, 5.0, 3.0]), 2)
    assert np.allclose(values, [5.0, 3.0])
    assert np.allclose(np.abs(vectors), [[0, 0], [1, 0], [0, 1]])
    with pytest.raises(ValueError, match="num_eigen"):
        hac.top_eigenpairs(np.eye(3), 4)


def test_identical_data_has_relevance_one():
    x = np.random.default_rng(0).normal(size=(50, 6))
    assert r_of(x, x.copy()) == pytest.approx(1.0, abs=1e-12)


def test_orthogonal_supports_have_relevance_near_zero():
    rng = np.random.default_rng(1)
    x_i, x_j = np.zeros((40, 6)), np.zeros((40, 6))
    x_i[:, :3], x_j[:, 3:] = rng.normal(size=(40, 3)), rng.normal(size=(40, 3))
    assert r_of(x_i, x_j) < 1e-6 and r_of(x_j, x_i) < 1e-6


def test_diagonal_grams_give_the_min_max_ratio_by_hand():
    # Σ_i = diag(3, 1): λ_i = (3, 1). Σ_j = diag(1, 3): v^(j) = (e2, e1), λ̂ = (‖Σ_i e2‖, ‖Σ_i e1‖)
    gram_i = np.diag([3.0, 1.0])
    values_i, _ = hac.top_eigenpairs(gram_i, 2)
    _, vectors_j = hac.top_eigenpairs(np.diag([1.0, 3.0]), 2)
    projected = hac.projected_eigenvalues(gram_i, vectors_j)
    assert np.allclose(projected, [1.0, 3.0])
    assert hac.relevance(values_i, projected) == pytest.approx(1 / 3)


def test_relevance_is_the_geometric_mean_of_min_over_max():
    assert hac.relevance([4.0], [1.0]) == pytest.approx(0.25)
    assert hac.relevance([1.0], [4.0]) == pytest.approx(0.25)  # min/max: order-free
    assert hac.relevance([2.0, 1.0], [1.0, 2.0]) == pytest.approx(0.5)
    # (1 · 1/2 · 1/4)^{1/3} = 1/2: the 1/k power, not the plain product
    assert hac.relevance([1.0, 1.0, 1.0], [1.0, 0.5, 0.25]) == pytest.approx(0.5)
    assert hac.relevance([1.0, 0.0], [1.0, 0.0]) == pytest.approx(1.0)  # 0/0: a match
    assert hac.relevance([1.0, 1.0], [1.0, 0.0]) == 0.0


def test_relevance_matrix_is_symmetric_and_averages_both_estimates():
    r = np.array([[1.0, 0.9, 0.2], [0.7, 1.0, 0.4], [0.1, 0.3, 1.0]])
    big_r = hac.symmetric_relevance(r)
    assert np.array_equal(big_r, big_r.T)
    assert big_r[0, 1] == pytest.approx(0.8) and big_r[0, 2] == pytest.approx(0.15)
    assert np.allclose(np.diag(big_r), 1.0)


def test_relevance_row_estimates_every_other_user():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 5))
    gram, values, vectors = eigen(x, 2)
    row = hac.relevance_row(gram, values, {3: vectors, 7: np.eye(5)[:, :2]})
    assert set(row) == {3, 7} and row[3] == pytest.approx(1.0)


PAPER_TABLE_I = np.array(
    [
        [1, 0.97, 0.31, 0.31, 0.32],
        [0.97, 1, 0.31, 0.32, 0.32],
        [0.31, 0.31, 1, 0.97, 0.98],
        [0.31, 0.32, 0.97, 1, 0.98],
        [0.32, 0.32, 0.98, 0.98, 1],
    ]
)


@pytest.mark.parametrize("linkage", hac.LINKAGES)
def test_hac_splits_the_papers_table_into_its_two_tasks(linkage):
    labels, z = hac.hac_clusters(PAPER_TABLE_I, 2, linkage)
    assert labels.tolist() == [0, 0, 1, 1, 1]
    assert z.shape == (4, 4)


def test_hac_recovers_three_hand_made_blocks_named_by_smallest_member():
    blocks = [0, 1, 0, 2, 1, 0, 2, 0]
    big_r = np.where(np.equal.outer(blocks, blocks), 0.9, 0.3)
    np.fill_diagonal(big_r, 1.0)
    labels, _ = hac.hac_clusters(big_r, 3)
    assert labels.tolist() == blocks
    assert hac.hac_clusters(big_r, 8)[0].tolist() == list(range(8))
    with pytest.raises(ValueError, match="linkage"):
        hac.hac_clusters(big_r, 3, "ward")


def test_random_clusters_keep_the_sizes_and_depend_on_the_seed():
    labels = np.array([0] * 5 + [1] * 3 + [2] * 2)
    draws = [hac.random_same_sizes(labels, seed) for seed in range(5)]
    for draw in draws:
        assert sorted(np.bincount(draw).tolist()) == [2, 3, 5]
        assert draw[0] == 0  # named by smallest member
    assert len({tuple(draw) for draw in draws}) > 1
    assert np.array_equal(hac.random_same_sizes(labels, 3), draws[3])


def test_feature_map_is_identity_for_grey_images():
    x = torch.rand(4, 1, 28, 28)
    phi, used = features.feature_map(x, "auto", seed=0)
    assert used == "identity" and phi.shape == (4, 784)
    assert np.allclose(phi, x.flatten(1).double().numpy())


def test_colour_images_fall_back_to_a_seeded_projection(monkeypatch):
    monkeypatch.setattr(features, "pretrained_weights", lambda: None)
    x = torch.rand(6, 3, 8, 8)
    phi, used = features.feature_map(x, "auto", seed=5, dim=16)
    assert used == "random_projection" and phi.shape == (6, 16)
    again, _ = features.feature_map(x[:2], "pretrained", seed=5, dim=16)
    assert np.allclose(again, phi[:2])  # every user of a seed shares one projection
    other, _ = features.feature_map(x, "random_projection", seed=6, dim=16)
    assert not np.allclose(other, phi)
    with pytest.raises(ValueError, match="feature_map"):
        features.resolve("pixels", 3)
