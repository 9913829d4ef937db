"""LEAF's Synthetic(α, β) (raymtl/data/leaf_synthetic.py): the generator against FedProx's
formulas, its streams, and 100,000 clients that the driver knows by their counts only."""

from __future__ import annotations

import math
import pickle
import tracemalloc

import numpy as np
import pytest
import torch

from raymtl.data import load_pool
from raymtl.data.client_data import materialize_generated
from raymtl.data.leaf_synthetic import (
    DIMENSION,
    NUM_CLASSES,
    load_leaf_synthetic,
    synthetic_client,
    synthetic_counts,
    synthetic_parameters,
)
from raymtl.data.natural import natural
from raymtl.data.source_registry import is_keyed

LARGE = 200_000  # samples of the client checked against the formulas
VARIANCES = np.arange(1, DIMENSION + 1, dtype=np.float64) ** -1.2  # Σ = diag(j^-1.2)


def test_samples_follow_the_formulas() -> None:
    weight, bias, mean = synthetic_parameters(3, 5, 1.0, 1.0, False)
    assert weight.shape == (NUM_CLASSES, DIMENSION) and bias.shape == (NUM_CLASSES,)
    x, y = synthetic_client(3, 5, 1.0, 1.0, False, LARGE)
    assert x.shape == (LARGE, DIMENSION) and x.dtype == np.float32
    assert y.shape == (LARGE,) and y.dtype == np.int64
    samples = x.astype(np.float64)
    # Mean: each coordinate within 5 standard errors (sqrt(Σ_jj / n)) of v_k.
    error = np.abs(samples.mean(axis=0) - mean)
    assert (error < 5 * np.sqrt(VARIANCES / LARGE)).all()
    # Covariance: the diagonal within 5 standard errors (Σ_jj sqrt(2 / n)) of j^-1.2, the
    # rest within 5 (sqrt(Σ_ii Σ_jj / n)) of 0.
    covariance = np.cov(samples, rowvar=False)
    scale = np.sqrt(np.outer(VARIANCES, VARIANCES))
    assert (np.abs(np.diag(covariance) - VARIANCES) < 5 * VARIANCES * math.sqrt(2 / LARGE)).all()
    off = ~np.eye(DIMENSION, dtype=bool)
    assert (np.abs(covariance[off]) < 5 * scale[off] / math.sqrt(LARGE)).all()
    # Labels: argmax softmax(W x + b) of the drawn W, b, on the float32 samples handed out.
    logits = samples @ weight.T + bias
    softmax = np.exp(logits - logits.max(axis=1, keepdims=True))
    assert np.array_equal(y, softmax.argmax(axis=1))


def test_client_parameters_follow_their_priors() -> None:
    """Across clients, u_k ~ N(0, α²) shows in the spread of the mean of W_k's entries and
    B_k ~ N(0, β²) in that of v_k's; within a client the entries have variance 1."""
    alpha, beta, clients = 2.0, 0.5, 2000
    drawn = [synthetic_parameters(0, k, alpha, beta, False) for k in range(clients)]
    w_means = np.array([np.concatenate([w.ravel(), b]).mean() for w, b, _ in drawn])
    v_means = np.array([v.mean() for _, _, v in drawn])
    # Var(mean of 610 entries) = α² + 1/610, Var(mean of 60) = β² + 1/60; 2,000 clients
    # estimate a standard deviation within about 1.6% (5 standard errors: 8%).
    assert w_means.std() == pytest.approx(math.sqrt(alpha**2 + 1 / 610), rel=0.08)
    assert v_means.std() == pytest.approx(math.sqrt(beta**2 + 1 / 60), rel=0.08)
    within = np.array([(w - w.mean()).std() for w, _, _ in drawn])
    assert within.mean() == pytest.approx(1.0, abs=0.02)


def test_zero_alpha_and_beta_still_give_each_client_its_model() -> None:
    first, second = (synthetic_parameters(0, k, 0.0, 0.0, False) for k in (0, 1))
    assert not np.array_equal(first[0], second[0])
    assert abs(np.concatenate([first[0].ravel(), first[1]]).mean()) < 5 / math.sqrt(610)


def test_iid_shares_one_model_and_centres_the_inputs() -> None:
    clients = [synthetic_parameters(4, k, 1.0, 1.0, True) for k in (0, 1, 17)]
    for weight, bias, mean in clients:
        assert np.array_equal(weight, clients[0][0]) and np.array_equal(bias, clients[0][1])
        assert not mean.any()
    assert not np.array_equal(clients[0][0], synthetic_parameters(5, 0, 1.0, 1.0, True)[0])
    x, y = synthetic_client(4, 17, 1.0, 1.0, True, LARGE)
    assert (np.abs(x.astype(np.float64).mean(axis=0)) < 5 * np.sqrt(VARIANCES / LARGE)).all()
    weight, bias, _ = clients[0]
    assert np.array_equal(y, (x.astype(np.float64) @ weight.T + bias).argmax(axis=1))
    other_x, _ = synthetic_client(4, 1, 1.0, 1.0, True, 50)
    assert not np.array_equal(other_x, x[:50])  # shared model, each client its own samples


def test_a_client_is_the_same_whatever_else_is_made() -> None:
    x, y = synthetic_client(7, 12, 1.0, 1.0, False, 300)
    synthetic_client(7, 11, 1.0, 1.0, False, 1000)  # another client made first changes nothing
    again_x, again_y = synthetic_client(7, 12, 1.0, 1.0, False, 300)
    assert np.array_equal(x, again_x) and np.array_equal(y, again_y)
    other_x, _ = synthetic_client(7, 13, 1.0, 1.0, False, 300)
    other_seed_x, _ = synthetic_client(8, 12, 1.0, 1.0, False, 300)
    assert not np.array_equal(x, other_x) and not np.array_equal(x, other_seed_x)
    first_x, _ = synthetic_client(7, 12, 1.0, 1.0, False, 100)
    assert np.array_equal(first_x, x[:100])  # fewer samples: the first ones of the same stream


def test_counts_are_fedprox_lognormal_plus_fifty() -> None:
    counts = synthetic_counts(100_000, seed=0)
    assert counts.dtype == np.int64 and counts.shape == (100_000,)
    assert counts.min() >= 50
    # floor(lognormal(4, 2)) + 50: median floor(e^4) + 50 = 104; P(count >= e^6 + 50) is
    # P(Z >= 1) = 0.159; P(count >= e^8 + 50), P(Z >= 2) = 0.0228 (a heavy tail).
    assert 103 <= np.median(counts) <= 106
    assert np.mean(counts >= math.exp(6) + 50) == pytest.approx(0.1587, abs=0.005)
    assert np.mean(counts >= math.exp(8) + 50) == pytest.approx(0.0228, abs=0.002)
    assert np.array_equal(counts, synthetic_counts(100_000, seed=0))
    assert not np.array_equal(counts, synthetic_counts(100_000, seed=1))
    assert np.array_equal(synthetic_counts(100_000, 0, max_samples=80), np.minimum(counts, 80))


def test_the_pool_is_counts_and_a_picklable_generator() -> None:
    pool = load_leaf_synthetic(seed=2, num_clients=5, alpha=0.5, beta=0.0)
    assert is_keyed("leaf_synthetic")
    assert pool.x.shape == (0, 1, 1, DIMENSION) and pool.y.shape == (0,)
    assert pool.y.dtype == torch.int64 and pool.x.dtype == torch.float32
    assert pool.num_classes == 10 and pool.class_names == tuple("0123456789")
    assert pool.inputs == "vectors" and pool.source == "leaf_synthetic(0.5, 0)"
    assert pool.num_keyed_clients == 5
    assert np.array_equal(pool.generated.counts, synthetic_counts(5, seed=2))
    shipped = pickle.loads(pickle.dumps(pool))
    x, y = shipped.generated.generate(3)
    expected_x, expected_y = synthetic_client(2, 3, 0.5, 0.0, False, int(pool.generated.counts[3]))
    assert x.shape == (len(expected_x), 1, 1, DIMENSION)
    assert torch.equal(x.flatten(1), torch.from_numpy(expected_x))
    assert torch.equal(y, torch.from_numpy(expected_y))
    assert load_leaf_synthetic(iid=True).source == "leaf_synthetic(iid)"
    assert len(load_leaf_synthetic().generated.counts) == 20  # data.num_clients left out


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"alpha": -1.0}, "data.params.alpha: -1.0 must be a number >= 0"),
        ({"beta": float("nan")}, "data.params.beta:"),
        ({"beta": float("inf")}, "data.params.beta: inf must be finite"),
        ({"alpha": "1"}, "data.params.alpha:"),
        ({"num_clients": 0}, "data.num_clients: 0 must be a positive integer"),
        ({"iid": 1}, "data.params.iid:"),
        ({"max_samples": 2}, "data.params.max_samples: 2 must be an integer >= 3"),
    ],
)
def test_bad_settings_are_one_line_errors(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")) as error:
        load_leaf_synthetic(**params)
    assert "\n" not in str(error.value)


def test_100k_clients_without_their_samples_on_the_driver() -> None:
    clients = 100_000
    tracemalloc.start()
    try:
        pool = load_pool("leaf_synthetic", seed=0, num_clients=clients)
        shards = natural(pool, clients, seed=0, test_fraction=0.2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    counts = pool.generated.counts
    assert len(pool.x) == 0 and len(counts) == clients and len(shards) == clients
    # The samples would take 240 bytes each (60 float32); the driver holds the counts and
    # the shards' index arrays (8 bytes a sample), well under a tenth of that.
    samples = int(counts.sum())
    assert peak < 24 * samples + (64 << 20), (peak, samples)
    shard = shards[12_345]
    assert shard.key == 12_345
    assert len(shard.train_idx) + len(shard.test_idx) == counts[12_345]
    data = materialize_generated(pool, shard, seed=0)
    x, y = synthetic_client(0, 12_345, 1.0, 1.0, False, int(counts[12_345]))
    train = len(shard.train_idx)
    assert data.input_shape == (1, 1, DIMENSION)
    assert torch.equal(data.train_x.flatten(1), torch.from_numpy(x[:train]))
    assert torch.equal(data.test_x.flatten(1), torch.from_numpy(x[train:]))
    assert torch.equal(data.train_y, torch.from_numpy(y[:train]))
    assert torch.equal(data.test_y, torch.from_numpy(y[train:]))


def test_logreg_reads_the_vectors() -> None:
    from raymtl.models import build_model, num_params

    pool = load_leaf_synthetic(num_clients=2)
    x, _ = pool.generated.generate(0)
    model = build_model("logreg", tuple(pool.x.shape[1:]), pool.num_classes)
    assert num_params(model) == DIMENSION * NUM_CLASSES + NUM_CLASSES
    assert model(x).shape == (len(x), NUM_CLASSES)
