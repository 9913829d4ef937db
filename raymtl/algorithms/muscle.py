"""The Muscle loss of FedMuscle (docs/ALGORITHMS.md §14) and pairwise InfoNCE, as tensor functions.

Anchor client n, partners m_1..m_M, unit rows z (d dims) on the same B public samples:

    S_j = Σ_k z^{m_k}_{j_k}                                    j = (j_1..j_M) ∈ [B]^M
    α_j = exp(−γ Σ_{k<l} z^{m_k}_{j_k} · z^{m_l}_{j_l}),       γ = 1/τ' − 1/τ  (> 0)
    L   = −(1/B) Σ_i log[ α_(i..i) exp(z^n_i·S_(i..i)/τ) / Σ_j α_j exp(z^n_i·S_j/τ) ]

No Python loop runs over tuples: S is the broadcast sum of the M partner matrices over a
(B,)*M grid, log α the broadcast sum of the M(M−1)/2 partner Gram matrices Z^{m_k}Z^{m_l}ᵀ.

Cost as B and M grow (fp32):
    server, per anchor   S: B^M·d floats, α: B^M — 33.7 MB at B=32, M=3, d=256 (×32 per +1 M)
                         time O(B^M·d)
    client, per step     logits z·Sᵀ: B·B^M floats (4.2 MB at B=32, M=3), O(B^{M+1}·d) flops
    `partners` downlink  the same loss from the M partner matrices themselves (M·B·d floats,
                         98 KB at M=3): the client builds the (B,)*(M+1) grid of
                         Σ_k z^n_i·z^{m_k}_{j_k} and log α from M+M(M−1)/2 Gram matrices,
                         O(B^{M+1}·M) time — the tuple tensor is never formed.
Pairwise InfoNCE: Σ_m CE(Z^n Z^{m}ᵀ/τ, diagonal), B² logits per partner.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F


def gamma_of(tau: float, tau_prime: float) -> float:
    """γ = 1/τ' − 1/τ (positive when τ' < τ: tuples whose partners disagree weigh more)."""
    return 1.0 / tau_prime - 1.0 / tau


def _on_axis(matrix: torch.Tensor, axis: int, grid_axes: int) -> torch.Tensor:
    """`matrix` (B, ...) viewed so its first dim lies on `axis` of a (B,)*grid_axes grid."""
    shape = [1] * grid_axes + list(matrix.shape[1:])
    shape[axis] = matrix.shape[0]
    return matrix.reshape(shape)


def log_alpha_grid(partners: torch.Tensor, gamma: float, offset: int = 0) -> torch.Tensor:
    """−γ Σ_{k<l} z^{m_k}_{j_k}·z^{m_l}_{j_l} on a (B,)*(offset+M) grid (partner k on axis
    offset+k; the first `offset` axes are left for the anchor)."""
    count, size = partners.shape[0], partners.shape[1]
    axes = offset + count
    grid = torch.zeros([1] * axes, dtype=partners.dtype, device=partners.device)
    for first, second in itertools.combinations(range(count), 2):  # M(M−1)/2 Grams, no tuples
        gram = partners[first] @ partners[second].T  # (B, B)
        shape = [1] * axes
        shape[offset + first], shape[offset + second] = size, size
        grid = grid + gram.reshape(shape)
    return -gamma * grid


def tuple_targets(partners: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """S (B^M, d) and α (B^M,) for partner matrices `partners` (M, B, d); flat index of the
    tuple j is j_1·B^{M−1} + … + j_M (row-major)."""
    count, size, dim = partners.shape
    total = torch.zeros([1] * count + [dim], dtype=partners.dtype, device=partners.device)
    for k in range(count):
        total = total + _on_axis(partners[k], k, count)
    log_alpha = log_alpha_grid(partners, gamma).expand([size] * count)
    return total.reshape(size**count, dim), log_alpha.reshape(-1).exp()


def positive_index(size: int, count: int) -> torch.Tensor:
    """Flat indices of the tuples (i, …, i), i ∈ [B], in a (B,)*M row-major grid."""
    return torch.arange(size) * sum(size**k for k in range(count))


def muscle_loss(
    z: torch.Tensor, tuples: torch.Tensor, alpha: torch.Tensor, tau: float, count: int
) -> torch.Tensor:
    """The Muscle loss of anchor rows `z` (B, d) against S (B^M, d) and α (B^M,)."""
    logits = z @ tuples.T / tau + alpha.log()  # (B, B^M): log[α_j exp(z_i·S_j/τ)]
    positives = logits[torch.arange(z.shape[0]), positive_index(z.shape[0], count)]
    return (torch.logsumexp(logits, dim=1) - positives).mean()


def muscle_loss_from_partners(
    z: torch.Tensor, partners: torch.Tensor, tau: float, gamma: float
) -> torch.Tensor:
    """The same loss from the partner matrices (M, B, d): logits on a (B,)*(M+1) grid whose
    first axis is the anchor's sample i."""
    count, size = partners.shape[0], partners.shape[1]
    logits = log_alpha_grid(partners, gamma, offset=1)
    for k in range(count):
        shape = [1] * (count + 1)
        shape[0], shape[k + 1] = size, size
        logits = logits + (z @ partners[k].T / tau).reshape(shape)  # z_i·z^{m_k}_{j_k}/τ
    logits = logits.expand([size] * (count + 1)).reshape(size, -1)
    positives = logits[torch.arange(size), positive_index(size, count)]
    return (torch.logsumexp(logits, dim=1) - positives).mean()


def pairwise_infonce(z: torch.Tensor, partners: torch.Tensor, tau: float) -> torch.Tensor:
    """Σ_m InfoNCE(Z^n, Z^m): cross-entropy of z_i against partner m's rows, positive j = i."""
    targets = torch.arange(z.shape[0], device=z.device)
    return sum(F.cross_entropy(z @ other.T / tau, targets) for other in partners)
