"""HCA — hyper-conflict-averse aggregation of backbone deltas (pure torch/numpy/scipy).

Lu et al., "FedHCA2: Towards Hetero-Client Federated Multi-Task Learning", CVPR 2024
(function get_ca_delta), as used by ColNet: Feng et al. 2025, "ColNet: Collaborative
Optimization in Decentralized Federated Multi-task Learning Systems" (docs/ALGORITHMS.md §10).

With K groups, G = [Δ_1 … Δ_K] (each Δ_g a flattened backbone delta of dimension d):
    g0 = mean_g Δ_g,   c = ca_c·‖g0‖   (ca_c = 0.4)
    w* = argmin over the probability simplex of  f(w) = wᵀGᵀg0 + c·‖G w‖
         (scipy SLSQP, started at the uniform w)
    G_w = G w*,   U = (g0 + (c / ‖G_w‖)·G_w) / (1 + ca_c²)
This is CAGrad's dual: g0 + c·G_w/‖G_w‖ maximises min_g ⟨u, Δ_g⟩ over ‖u − g0‖ ≤ c.

Cost: everything goes through the K×K Gram matrix A = GᵀG, built once in O(K²d) (in
float64, over column chunks so no full float64 copy of G is made). Then ‖g0‖² = mean(A),
Gᵀg0 = A·1/K and ‖Gw‖² = wᵀAw, so each SLSQP iteration costs O(K²), independent of d.
U = Gᵀ·coef with coef = (1/K + (c/‖G_w‖)·w*)/(1 + ca_c²) is a second O(Kd) pass.

Guards (FedHCA2 uses absolute epsilons 1e-8; ours are relative): A is divided by its
largest diagonal entry s² (w* and c/‖G_w‖ are invariant to a common rescaling of the
deltas), then f uses sqrt(wᵀAw + 1e-8) so it stays smooth at G w = 0, and the step uses
c / (‖G_w‖ + 1e-8), so the added term has norm ≤ c and is 0 when G_w = 0. All-zero
deltas give U = 0 (w uniform, c = 0); K = 1 gives w = [1]. Non-finite input raises.
Deterministic: fixed chunk order, fixed SLSQP start and settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_SQRT_EPS = 1e-8  # inside sqrt(wᵀAw + eps) of the objective (A normalised)
_LAMBDA_EPS = 1e-8  # in c / (‖G_w‖ + eps) (norms relative to the largest delta)
_CHUNK = 1 << 22  # elements of d per float64 chunk (per group)


@dataclass(frozen=True)
class HCAResult:
    update: torch.Tensor  # U, shape (d,), input dtype and device
    weights: np.ndarray  # w*, shape (K,)
    c: float  # ca_c * ||g0||


def gram_matrix(deltas: torch.Tensor) -> torch.Tensor:
    """A = GᵀG (K×K) in float64 on the deltas' device, accumulated over fixed column chunks."""
    k, d = deltas.shape
    gram = torch.zeros(k, k, dtype=torch.float64, device=deltas.device)
    for start in range(0, d, _CHUNK):
        block = deltas[:, start : start + _CHUNK].to(torch.float64)
        gram += block @ block.T
    return gram


def _gram(deltas: torch.Tensor) -> np.ndarray:
    """`gram_matrix` on the CPU, symmetrised. A non-finite delta raises: its row's diagonal
    entry Σ x² is then non-finite (a float32 entry squared cannot overflow float64)."""
    gram = gram_matrix(deltas)
    if not bool(torch.isfinite(gram).all()):
        raise ValueError("hca: non-finite delta")
    gram = gram.cpu().numpy()
    return (gram + gram.T) / 2.0


def combine(deltas: torch.Tensor, coef: np.ndarray) -> torch.Tensor:
    """U = Gᵀ·coef, shape (d,), in the deltas' dtype and on their device (float64 products
    over the same column chunks as `gram_matrix`)."""
    coef_t = torch.from_numpy(coef).to(deltas.device)
    update = torch.empty_like(deltas[0])
    for start in range(0, deltas.shape[1], _CHUNK):
        block = deltas[:, start : start + _CHUNK].detach().to(torch.float64)
        update[start : start + _CHUNK] = (coef_t @ block).to(deltas.dtype)
    return update


def _solve(gram: np.ndarray, c: float) -> np.ndarray:
    """w* on the simplex for f(w) = wᵀA·1/K + c·sqrt(wᵀAw + eps) (A normalised)."""
    k = gram.shape[0]
    if k == 1:
        return np.ones(1)
    b = gram.mean(axis=1)  # Gᵀg0

    def fun(w: np.ndarray) -> float:
        return float(w @ b + c * np.sqrt(max(w @ gram @ w, 0.0) + _SQRT_EPS))

    def jac(w: np.ndarray) -> np.ndarray:
        return b + c * (gram @ w) / np.sqrt(max(w @ gram @ w, 0.0) + _SQRT_EPS)

    from scipy.optimize import minimize  # 0.2 s to import: only where HCA runs

    start = np.full(k, 1.0 / k)
    res = minimize(
        fun,
        start,
        jac=jac,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * k,
        constraints={"type": "eq", "fun": lambda w: 1.0 - w.sum(), "jac": lambda w: -np.ones(k)},
        options={"ftol": 1e-15, "maxiter": 500},
    )
    w = np.clip(np.asarray(res.x, dtype=np.float64), 0.0, 1.0)
    if not np.isfinite(w).all() or w.sum() <= 0 or fun(w / w.sum()) > fun(start):
        return start
    return w / w.sum()


def conflict_averse_update(deltas: torch.Tensor, ca_c: float = 0.4) -> HCAResult:
    """deltas: (K, d) float tensor, one row per group (fixed order)."""
    if deltas.ndim != 2 or deltas.shape[0] < 1:
        raise ValueError(f"hca: deltas must have shape (K, d) with K >= 1, got {deltas.shape}")
    if not deltas.is_floating_point():
        raise ValueError(f"hca: deltas must be floating point, got {deltas.dtype}")
    k = deltas.shape[0]
    gram = _gram(deltas.detach())
    scale2 = float(np.max(np.diag(gram)))
    if scale2 <= 0.0:  # all deltas are zero
        return HCAResult(torch.zeros_like(deltas[0]), np.full(k, 1.0 / k), 0.0)
    norm_gram = gram / scale2
    g0_norm = np.sqrt(max(norm_gram.mean(), 0.0))  # ‖g0‖ / s
    w = _solve(norm_gram, ca_c * g0_norm)
    gw_norm = np.sqrt(max(w @ norm_gram @ w, 0.0))  # ‖G_w‖ / s
    lam = ca_c * g0_norm / (gw_norm + _LAMBDA_EPS)
    coef = (np.full(k, 1.0 / k) + lam * w) / (1.0 + ca_c**2)
    update = combine(deltas, coef)
    return HCAResult(update, w, float(ca_c * g0_norm * np.sqrt(scale2)))
