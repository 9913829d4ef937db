"""LEAF's Synthetic(α, β): clients made on their hosts, each with its own linear softmax task.

The data set of FedProx (Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020, §5.1; after Shamir et al., "Communication-Efficient Distributed Optimization
using an Approximate Newton-type Method", ICML 2014), as LEAF ships it (its
`generate_synthetic.py`). Client k (of K) holds samples (x, y), x ∈ ℝ^60, y ∈ {0..9}:

    u_k ~ N(0, α²),  B_k ~ N(0, β²)            α, β: standard deviations, as FedProx's
                                               `np.random.normal(0, alpha, NUM_USER)`
    W_k ∈ ℝ^{10×60}, b_k ∈ ℝ^10, entries ~ N(u_k, 1)    the client's model
    v_k ∈ ℝ^60, entries ~ N(B_k, 1)                      the mean of its inputs
    x ~ N(v_k, Σ),  Σ = diag(j^-1.2), j = 1..60
    y = argmax softmax(W_k x + b_k)  (= argmax of the logits)

α sets how far the clients' models are apart, β how far their inputs are. The number of
samples of client k is FedProx's floor(lognormal(4, 2)) + 50 (μ = 4, σ = 2 of the
underlying normal: a heavy-tailed, "power-law" spread, median e^4 + 50 ≈ 104), drawn once
on the driver from the seed (K integers are all the driver holds). Synthetic-IID
(`iid: true`): every client shares one W, b (entries ~ N(0, 1)) and v_k = 0, so α and β
are not used (FedProx's generator sets v_k = B_k·1, which its Synthetic-IID, α = β = 0,
makes 0).

Each client's parameters and samples come from its own stream, `default_rng([seed, k,
tag])`, so a host makes any client alone, and the same client every time; the shared
W, b of Synthetic-IID come from a stream of their own. The pool is `Pool.generated`: an
empty x of shape (0, 1, 1, 60) and the counts; the natural partition splits each count
into train and test, and the host holding client k calls `generate(k)`.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import torch

from raymtl.data.shards import MIN_TEST, MIN_TRAIN
from raymtl.data.source_registry import Generated, Pool, register_dataset

DIMENSION = 60
NUM_CLASSES = 10
DEFAULT_CLIENTS = 20  # when data.num_clients is left out
# FedProx's sample counts: floor(lognormal(mean 4, sigma 2)) + 50.
COUNT_MEAN, COUNT_SIGMA, COUNT_OFFSET = 4.0, 2.0, 50
MIN_SAMPLES = MIN_TRAIN + MIN_TEST  # the least max_samples may cap a client to
# Non-zero last words keep the streams apart (SeedSequence pads keys with zeros, so
# [s, k] and [s, k, 0] would be one stream).
_CLIENT_TAG = 0x1EAF_5C01
_COUNTS_TAG = 0x1EAF_5C02
_SHARED_TAG = 0x1EAF_5C03
_CHUNK = 1 << 16  # samples drawn and labelled at a time (bounds the float64 scratch)
# Σ = diag(j^-1.2): the standard deviation of input j is j^-0.6.
_STD = np.power(np.arange(1, DIMENSION + 1, dtype=np.float64), -0.6)


def synthetic_counts(num_clients: int, seed: int, max_samples: int | None = None) -> np.ndarray:
    """(num_clients,) int64: floor(lognormal(4, 2)) + 50 samples per client (each >= 50),
    capped at `max_samples` when given."""
    rng = np.random.default_rng([seed, _COUNTS_TAG])
    counts = rng.lognormal(COUNT_MEAN, COUNT_SIGMA, num_clients).astype(np.int64) + COUNT_OFFSET
    counts = np.maximum(counts, MIN_SAMPLES)
    return counts if max_samples is None else np.minimum(counts, max_samples)


def _shared(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic-IID's W (10, 60) and b (10,), entries ~ N(0, 1), from their own stream."""
    rng = np.random.default_rng([seed, _SHARED_TAG])
    return rng.normal(0.0, 1.0, (NUM_CLASSES, DIMENSION)), rng.normal(0.0, 1.0, NUM_CLASSES)


def _draw_parameters(rng: np.random.Generator, seed: int, alpha: float, beta: float, iid: bool):
    if iid:
        weight, bias = _shared(seed)
        return weight, bias, np.zeros(DIMENSION)
    u = rng.normal(0.0, alpha)
    big_b = rng.normal(0.0, beta)
    weight = rng.normal(u, 1.0, (NUM_CLASSES, DIMENSION))
    bias = rng.normal(u, 1.0, NUM_CLASSES)
    return weight, bias, rng.normal(big_b, 1.0, DIMENSION)


def synthetic_parameters(
    seed: int, client: int, alpha: float, beta: float, iid: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Client `client`'s W (10, 60), b (10,) and input mean v (60,), float64: the ones
    `synthetic_client` draws its samples from."""
    return _draw_parameters(_client_rng(seed, client), seed, alpha, beta, iid)


def synthetic_client(
    seed: int, client: int, alpha: float, beta: float, iid: bool, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """Client `client`'s `count` samples: x (count, 60) float32 ~ N(v, Σ) and
    y (count,) int64 = argmax(W x + b), from the client's own stream."""
    rng = _client_rng(seed, client)
    weight, bias, mean = _draw_parameters(rng, seed, alpha, beta, iid)
    x = np.empty((count, DIMENSION), dtype=np.float32)
    y = np.empty(count, dtype=np.int64)
    for start in range(0, count, _CHUNK):
        stop = min(start + _CHUNK, count)
        x[start:stop] = mean + rng.standard_normal((stop - start, DIMENSION)) * _STD
        # The labels of the float32 samples handed out (softmax keeps the argmax).
        logits = x[start:stop].astype(np.float64) @ weight.T + bias
        y[start:stop] = logits.argmax(axis=1)
    return x, y


def _client_rng(seed: int, client: int) -> np.random.Generator:
    return np.random.default_rng([seed, int(client), _CLIENT_TAG])


def _generate(
    seed: int, alpha: float, beta: float, iid: bool, counts: np.ndarray, client: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`Generated.generate`: client `client`'s samples as (n, 1, 1, 60) and (n,) tensors."""
    x, y = synthetic_client(seed, client, alpha, beta, iid, int(counts[int(client)]))
    return torch.from_numpy(x).view(-1, 1, 1, DIMENSION), torch.from_numpy(y)


def _check_std(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"data.params.{name}: {value!r} must be a number >= 0")
    if not math.isfinite(value):
        raise ValueError(f"data.params.{name}: {value!r} must be finite")
    return float(value)


@register_dataset("leaf_synthetic", keyed=True)
def load_leaf_synthetic(
    root: str | None = None,
    download: bool = False,
    seed: int = 0,
    num_clients: int | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    max_samples: int | None = None,
) -> Pool:
    """LEAF's Synthetic(alpha, beta) of FedProx: 60-d inputs, 10 classes, made per client."""
    alpha, beta = _check_std("alpha", alpha), _check_std("beta", beta)
    clients = DEFAULT_CLIENTS if num_clients is None else num_clients
    if isinstance(clients, bool) or not isinstance(clients, int) or clients < 1:
        raise ValueError(f"data.num_clients: {num_clients!r} must be a positive integer")
    if not isinstance(iid, bool):
        raise ValueError(f"data.params.iid: {iid!r} must be true or false")
    if max_samples is not None and (
        isinstance(max_samples, bool)
        or not isinstance(max_samples, int)
        or max_samples < MIN_SAMPLES
    ):
        raise ValueError(
            f"data.params.max_samples: {max_samples!r} must be an integer >= {MIN_SAMPLES}"
        )
    counts = synthetic_counts(clients, seed, max_samples)
    generate = partial(_generate, seed, alpha, beta, iid, counts)  # counts: the same array
    source = "leaf_synthetic(iid)" if iid else f"leaf_synthetic({alpha:g}, {beta:g})"
    return Pool(
        x=torch.empty((0, 1, 1, DIMENSION), dtype=torch.float32),
        y=torch.empty(0, dtype=torch.int64),
        num_classes=NUM_CLASSES,
        class_names=tuple(str(label) for label in range(NUM_CLASSES)),
        scale=1.0,
        source=source,
        generated=Generated(counts, generate),
        inputs="vectors",
    )
