"""The attacks of a robustness study (raymtl.toolbox.attacks, docs/ALGORITHMS.md §9.5):
the malicious set, what a malicious client sends, the flipped labels. No Ray, no GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymtl.toolbox.attacks import (
    ATTACK_STREAM,
    attack_update,
    attacks_data,
    attacks_update,
    flip_labels,
    malicious_clients,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_malicious_count_from_the_decimal():
    assert len(malicious_clients(100, 0.07, seed=0)) == 7
    assert len(malicious_clients(10, 0.3, seed=0)) == 3
    assert 0.29 * 100 < 29  # the float product would give 28
    assert len(malicious_clients(100, 0.29, seed=0)) == 29
    assert malicious_clients(10, 0.0, seed=0) == ()
    assert malicious_clients(10, 0.05, seed=0) == ()  # ⌊0.5⌋ = 0
    assert len(malicious_clients(10, 0.99, seed=0)) == 9


def test_malicious_set_is_drawn_once_per_seed():
    first = malicious_clients(50, 0.2, seed=3)
    assert first == malicious_clients(50, 0.2, seed=3)
    assert first == tuple(sorted(first)) and len(set(first)) == 10
    assert all(isinstance(k, int) and 0 <= k < 50 for k in first)
    expected = np.random.default_rng([3, ATTACK_STREAM]).choice(50, size=10, replace=False)
    assert first == tuple(sorted(int(k) for k in expected))
    assert len({malicious_clients(50, 0.2, seed=s) for s in range(5)}) > 1


def test_malicious_fraction_is_checked():
    with pytest.raises(ValueError):
        malicious_clients(10, 1.0, seed=0)
    with pytest.raises(ValueError):
        malicious_clients(10, -0.1, seed=0)


def delta() -> dict[str, torch.Tensor]:
    return {
        "w": torch.tensor([[1.0, -2.0], [0.5, 0.0]]),
        "b": torch.tensor([3.0, -1.0], dtype=torch.float64),
        "count": torch.tensor([7]),
    }


def test_sign_flip():
    out = attack_update("sign_flip", delta(), 1.0, gen())
    assert list(out) == ["w", "b", "count"]
    assert out["w"].tolist() == [[-1.0, 2.0], [-0.5, 0.0]]
    assert out["b"].tolist() == [-3.0, 1.0] and out["b"].dtype == torch.float64
    assert out["count"].tolist() == [7]  # not a float tensor: unchanged
    assert attack_update("sign_flip", delta(), 2.0, gen())["w"].tolist() == [
        [-2.0, 4.0],
        [-1.0, 0.0],
    ]


def test_scale():
    out = attack_update("scale", delta(), 10.0, gen())
    assert out["w"].tolist() == [[10.0, -20.0], [5.0, 0.0]]
    assert out["b"].tolist() == [30.0, -10.0]
    assert out["count"].tolist() == [7]


def test_label_flip_sends_the_update_unchanged():
    original = delta()
    out = attack_update("label_flip", original, 1.0, gen())
    assert all(torch.equal(out[name], original[name]) for name in original)


def test_gaussian_draws_in_name_order():
    out = attack_update("gaussian", delta(), 2.0, gen(5))
    generator = gen(5)
    w = torch.randn((2, 2), generator=generator) * 2.0
    b = torch.randn((2,), generator=generator) * 2.0
    assert torch.equal(out["w"], w)
    assert torch.equal(out["b"], b.double()) and out["b"].dtype == torch.float64
    assert out["count"].tolist() == [7]
    again = attack_update("gaussian", delta(), 2.0, gen(5))
    assert all(torch.equal(out[name], again[name]) for name in out)


def test_gaussian_std():
    big = {"w": torch.zeros(200_000)}
    noise = attack_update("gaussian", big, 3.0, gen(1))["w"]
    assert noise.mean().item() == pytest.approx(0.0, abs=0.05)
    assert noise.std().item() == pytest.approx(3.0, rel=0.01)


def test_flip_labels():
    labels = torch.tensor([0, 1, 2, 9])
    flipped = flip_labels(labels, 10)
    assert flipped.tolist() == [9, 8, 7, 0] and flipped.dtype == labels.dtype
    assert torch.equal(flip_labels(flipped, 10), labels)
    assert flip_labels(torch.tensor([0, 1], dtype=torch.uint8), 2).tolist() == [1, 0]
    with pytest.raises(TypeError):
        flip_labels(torch.tensor([0.0, 1.0]), 2)


def test_what_each_attack_acts_on():
    assert attacks_data("label_flip") and not attacks_update("label_flip")
    for kind in ("sign_flip", "scale", "gaussian"):
        assert attacks_update(kind) and not attacks_data(kind)
    with pytest.raises(ValueError):
        attacks_update("nonsense")
    with pytest.raises(ValueError):
        attack_update("nonsense", delta(), 1.0, gen())
