"""HCA (FedHCA2's conflict-averse aggregation), checked independently of its Gram-matrix
solver: objective and gradient are evaluated here directly in d-space with numpy."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from raymtl.algorithms import hca
from raymtl.algorithms.hca import HCAResult, conflict_averse_update

CA = 0.4
RESCALE = 1.0 + CA**2


def _objective(deltas: np.ndarray, ws: np.ndarray, ca_c: float = CA) -> np.ndarray:
    """f(w) = wᵀGᵀg0 + c‖Gw‖ for each row of ws (n, K), with deltas (K, d)."""
    g0 = deltas.mean(axis=0)
    c = ca_c * np.linalg.norm(g0)
    gw = ws @ deltas  # (n, d)
    return gw @ g0 + c * np.linalg.norm(gw, axis=1)


def _gradient(deltas: np.ndarray, w: np.ndarray, ca_c: float = CA) -> np.ndarray:
    g0 = deltas.mean(axis=0)
    c = ca_c * np.linalg.norm(g0)
    gw = w @ deltas
    return deltas @ g0 + c * (deltas @ gw) / np.linalg.norm(gw)


def _simplex_grid(k: int, step: float) -> np.ndarray:
    n = round(1 / step)
    if k == 2:
        a = np.arange(n + 1) / n
        return np.stack([a, 1 - a], axis=1)
    rows = [(i, j, n - i - j) for i, j in itertools.product(range(n + 1), repeat=2) if i + j <= n]
    return np.asarray(rows, dtype=np.float64) / n


def _random_deltas(seed: int, k: int, d: int, conflict: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    deltas = rng.normal(size=(k, d))
    if not conflict:  # a shared direction, so the deltas mostly agree
        deltas += 2.0 * rng.normal(size=(1, d))
    return deltas


def _similar_norm_deltas(seed: int, k: int, d: int) -> np.ndarray:
    """Rows of comparable norm, so w* is a mix of vertex, edge and interior solutions."""
    rng = np.random.default_rng(seed)
    deltas = rng.normal(size=(k, d))
    if seed % 2:
        deltas += rng.normal(size=(1, d))
    norms = np.linalg.norm(deltas, axis=1, keepdims=True)
    return deltas / norms * rng.uniform(0.7, 1.3, size=(k, 1))


def _run(deltas: np.ndarray, ca_c: float = CA) -> HCAResult:
    return conflict_averse_update(torch.from_numpy(deltas), ca_c=ca_c)


# -- optimality of w* -----------------------------------------------------------------------


@pytest.mark.parametrize(("k", "step"), [(2, 0.001), (3, 0.005)])
@pytest.mark.parametrize("seed", range(8))
def test_weights_match_brute_force_grid(k, step, seed):
    deltas = _similar_norm_deltas(seed, k, d=6)
    res = _run(deltas)
    assert res.weights.shape == (k,)
    assert np.all(res.weights >= 0) and math.isclose(res.weights.sum(), 1.0, abs_tol=1e-12)
    grid = _simplex_grid(k, step)
    values = _objective(deltas, grid)
    f_star = _objective(deltas, res.weights[None])[0]
    scale = np.abs(values).max()
    assert f_star <= values.min() + 1e-9 * scale
    # G has full column rank (K ≤ d, Gaussian), so f is strictly convex: unique minimiser.
    assert np.abs(res.weights - grid[values.argmin()]).max() <= step


def test_brute_force_cases_cover_interior_and_boundary():
    weights = [_run(_similar_norm_deltas(seed, 3, d=6)).weights for seed in range(8)]
    n_positive = sorted(int((w > 1e-7).sum()) for w in weights)
    assert {1, 2, 3} <= set(n_positive)  # vertex, edge and interior minimisers


@pytest.mark.parametrize(("k", "d"), [(2, 3), (3, 5), (5, 20), (8, 50), (8, 3)])
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("conflict", [True, False])
def test_kkt_conditions_on_the_simplex(k, d, seed, conflict):
    deltas = _random_deltas(100 + seed, k, d, conflict)
    w = _run(deltas).weights
    grad = _gradient(deltas, w)
    tol = 1e-5 * np.abs(grad).max()
    active = w > 1e-7
    lam = grad[active].mean()
    assert np.abs(grad[active] - lam).max() <= tol
    assert np.all(grad[~active] >= lam - tol)


@pytest.mark.parametrize("seed", range(5))
def test_update_is_the_cagrad_dual_solution(seed):
    """u = (1+ca²)U stays within c of g0, and min_g ⟨u, Δ_g⟩ = f(w*) ≥ min_g ⟨g0, Δ_g⟩."""
    deltas = _random_deltas(200 + seed, 4, 10, conflict=True)
    res = _run(deltas)
    g0 = deltas.mean(axis=0)
    u = RESCALE * res.update.numpy()
    assert res.c == pytest.approx(CA * np.linalg.norm(g0), rel=1e-12)
    assert np.linalg.norm(u - g0) == pytest.approx(res.c, rel=1e-6)
    worst = (deltas @ u).min()
    assert worst == pytest.approx(_objective(deltas, res.weights[None])[0], rel=1e-6, abs=1e-9)
    assert worst >= (deltas @ g0).min() - 1e-12


# -- U by hand ------------------------------------------------------------------------------


def test_orthogonal_unit_deltas_by_hand():
    # Gᵀg0 = (½, ½) so the linear term is constant; ‖Gw‖ is smallest at w = (½, ½).
    # g0 = Gw = (½, ½), c/‖Gw‖ = ca_c, U = 1.4·(½, ½)/1.16.
    res = _run(np.array([[1.0, 0.0], [0.0, 1.0]]))
    np.testing.assert_allclose(res.weights, [0.5, 0.5], atol=1e-6)
    np.testing.assert_allclose(res.update.numpy(), [0.7 / 1.16, 0.7 / 1.16], rtol=1e-7)
    assert res.c == pytest.approx(0.4 / math.sqrt(2))


def test_orthogonal_unequal_deltas_by_hand():
    # Δ = (2, 0), (0, 1): g0 = (1, ½), c = 0.4·√1.25. At w = (0, 1): ∇f = (2, ½ + c) with
    # 2 > ½ + c, so the vertex is optimal; G_w = (0, 1), U = (1, ½ + c) / 1.16.
    c = 0.4 * math.sqrt(1.25)
    res = _run(np.array([[2.0, 0.0], [0.0, 1.0]]))
    np.testing.assert_allclose(res.weights, [0.0, 1.0], atol=1e-7)
    np.testing.assert_allclose(res.update.numpy(), [1 / 1.16, (0.5 + c) / 1.16], rtol=1e-7)


def test_single_group():
    delta = np.array([[0.3, -1.2, 2.0, 0.0]])
    res = _run(delta)
    np.testing.assert_array_equal(res.weights, [1.0])
    np.testing.assert_allclose(res.update.numpy(), (1 + CA) / (1 + CA**2) * delta[0], rtol=1e-7)


def test_identical_deltas():
    delta = np.array([0.5, -0.25, 1.0])
    res = _run(np.stack([delta] * 3))
    np.testing.assert_allclose(res.update.numpy(), (1 + CA) / (1 + CA**2) * delta, rtol=1e-7)


def test_zero_ca_c_is_the_plain_mean():
    deltas = _random_deltas(7, 4, 9, conflict=True)
    res = _run(deltas, ca_c=0.0)
    assert res.c == 0.0
    np.testing.assert_allclose(res.update.numpy(), deltas.mean(axis=0), rtol=1e-12, atol=1e-15)


def test_conflicting_deltas_improve_the_worse_group():
    deltas = np.array([[1.0, 0.0], [-0.9, 0.1]])
    g0 = deltas.mean(axis=0)  # (0.05, 0.05): ⟨g0, Δ⟩ = (0.05, -0.04)
    res = _run(deltas)
    u = res.update.numpy()
    mean_worst = (deltas @ g0).min()
    assert mean_worst == pytest.approx(-0.04)
    # By hand: at w = (0, 1), ∇f = Gᵀg0 + c·GᵀΔ2/‖Δ2‖ ≈ (0.0219, -0.0144), so the vertex on
    # the worse group is optimal and U = (g0 + c·Δ2/‖Δ2‖)/(1 + ca²).
    c = CA * np.linalg.norm(g0)
    np.testing.assert_allclose(res.weights, [0.0, 1.0], atol=1e-7)
    expected = (g0 + c * deltas[1] / np.linalg.norm(deltas[1])) / RESCALE
    np.testing.assert_allclose(u, expected, rtol=1e-7)
    # What holds: U (and the un-rescaled (1+ca²)U) beats the mean on the worse group ...
    inner = deltas @ u
    assert inner.min() > mean_worst and (deltas @ (RESCALE * u)).min() > mean_worst
    assert inner[1] == pytest.approx(-0.0124, abs=1e-4)  # from -0.04
    # ... but does not remove the conflict, and the better group gets less (0.05 → 0.019).
    assert inner[1] < 0 and 0 < inner[0] < (deltas @ g0)[0]


# -- degenerate inputs, dtype, determinism -------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
def test_all_zero_deltas(k):
    res = conflict_averse_update(torch.zeros(k, 5))
    assert torch.equal(res.update, torch.zeros(5))
    assert res.c == 0.0
    np.testing.assert_allclose(res.weights, np.full(k, 1 / k))


def test_cancelling_deltas_give_no_nan():
    delta = np.array([1.0, -2.0, 0.5])
    res = _run(np.stack([delta, -delta]))  # g0 = 0, and G_w = 0 at w = (½, ½)
    assert res.c == 0.0
    np.testing.assert_allclose(res.update.numpy(), 0.0, atol=1e-12)
    near = _run(np.stack([delta, -delta, 1e-9 * np.ones(3)]))
    u = RESCALE * near.update.numpy()
    assert np.all(np.isfinite(u))
    g0 = np.stack([delta, -delta, 1e-9 * np.ones(3)]).mean(axis=0)
    assert np.linalg.norm(u - g0) <= near.c * (1 + 1e-9)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_rejected(bad):
    deltas = torch.ones(3, 4)
    deltas[1, 2] = bad
    with pytest.raises(ValueError, match="hca: non-finite delta"):
        conflict_averse_update(deltas)


def test_bad_shape_rejected():
    with pytest.raises(ValueError):
        conflict_averse_update(torch.ones(4))
    with pytest.raises(ValueError):
        conflict_averse_update(torch.ones(0, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_dtype_preserved(dtype):
    deltas = torch.from_numpy(_random_deltas(3, 3, 8, conflict=True)).to(dtype)
    res = conflict_averse_update(deltas)
    assert res.update.dtype == dtype and res.update.shape == (8,)
    assert torch.isfinite(res.update).all()
    ref = conflict_averse_update(deltas.to(torch.float64))  # same (rounded) input in float64
    torch.testing.assert_close(res.update, ref.update.to(dtype))


def test_deterministic():
    deltas = torch.from_numpy(_random_deltas(11, 6, 20_000, conflict=True)).float()
    a, b = conflict_averse_update(deltas), conflict_averse_update(deltas.clone())
    assert torch.equal(a.update, b.update)
    assert np.array_equal(a.weights, b.weights) and a.c == b.c


def test_scale_invariance():
    deltas = _random_deltas(5, 4, 12, conflict=True)
    a, b = _run(deltas), _run(1e-6 * deltas)
    np.testing.assert_allclose(b.weights, a.weights, atol=1e-9)
    np.testing.assert_allclose(b.update.numpy(), 1e-6 * a.update.numpy(), rtol=1e-9)


def test_chunked_pass_matches(monkeypatch):
    deltas = torch.from_numpy(_random_deltas(9, 3, 101, conflict=True))
    whole = conflict_averse_update(deltas)
    monkeypatch.setattr(hca, "_CHUNK", 7)
    chunked = conflict_averse_update(deltas)
    torch.testing.assert_close(chunked.update, whole.update, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(chunked.weights, whole.weights, atol=1e-8)
