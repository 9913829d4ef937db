"""Central client-level DP on a server's combination: DP-FedAvg's clipped noisy mean.

McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018;
adaptive clipping: Andrew et al., "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021 (docs/ALGORITHMS.md §9.3).

Round t, w_t the server's model, S_t the sampled clients (m_t of them), C the clip bound:
    Δ_k  = x_k − w_t                            (after any decoding: §9.4)
    Δ̃_k  = Δ_k · min(1, C/‖Δ_k‖₂)               (the update vector: every float tensor)
    Δ_t  = (Σ_{k∈S_t} Δ̃_k + N(0, σ_Δ²C²·I)) / m_t
    w    = w_t + Δ_t                            (or Δ_t goes to the server optimiser, §9.2)
with σ_Δ = σ for fixed clipping. Adaptive clipping also counts b_k = 1[‖Δ_k‖₂ ≤ C] and moves
C ← C·exp(−η_C·(b̄ − γ)), b̄ = (Σ_k b_k + N(0, σ_b²))/m_t, with σ_Δ = (σ^−2 − (2σ_b)^−2)^−1/2
so that the pair spends what σ alone would. The mean is uniform (sample weights would raise
the sensitivity) and its denominator is the configured cohort m_t, whoever answered (under
`sampling: poisson`, its expectation q·N). The
noise comes from the seeded stream derive_seed(seed, round, server, "privacy"), so inline
equals Ray and a resume equals the uninterrupted run; a deployment draws from a secure one.
"""

from __future__ import annotations

import torch

from raymtl.algorithms.base import State, StepContext
from raymtl.algorithms.training import derive_seed
from raymtl.toolbox.privacy import (
    adaptive_clip,
    default_count_sigma,
    private_mean,
    sigma_delta,
)

Tensors = dict[str, torch.Tensor]


def private_combine(
    updates: list[tuple[Tensors, float]],
    ctx: StepContext,
    state: State | None,
    reference: Tensors,
    slot: str = "",
) -> Tensors:
    """w_t + Δ_t (see the module) over the finite `updates` [(x_k, n_k)] (their n_k unused);
    the clip bound is kept in `state.extras["privacy<slot>"]` and reported with the count of
    clipped updates (`ctx.report`)."""
    privacy = ctx.toolbox.privacy
    kept = state.extras.setdefault(f"privacy{slot}", {}) if state is not None else {}
    clip = float(kept.get("clip", privacy.clip))
    cohort = ctx.toolbox.cohort or max(1, len(ctx.sampled))
    sigma = privacy.noise_multiplier
    count_sigma = privacy.count_noise or default_count_sigma(cohort)
    adaptive = privacy.clipping == "adaptive"
    noise_multiplier = sigma_delta(sigma, count_sigma) if adaptive else sigma
    names = [name for name in reference if all(name in x for x, _ in updates)]
    deltas = [{name: x[name] - reference[name] for name in names} for x, _ in updates]
    generator = torch.Generator().manual_seed(derive_seed(ctx.seed, ctx.round, ctx.me, "privacy"))
    mean, norms = private_sum_mean(deltas, clip, noise_multiplier * clip, cohort, generator)
    clipped = sum(norm > clip for norm in norms)
    ctx.report(clip=clip, clipped=int(clipped), updates=len(norms))
    if adaptive:
        below = [norm <= clip for norm in norms]
        kept["clip"] = adaptive_clip(
            clip, below, count_sigma, privacy.target_quantile, privacy.clip_lr, generator
        )
    return reference | {name: reference[name] + mean[name] for name in names}


def private_sum_mean(
    deltas: list[Tensors], clip: float, noise_std: float, cohort: float, generator
) -> tuple[Tensors, list[float]]:
    """(Σ_k clip(Δ_k) + N(0, noise_std²))/cohort, and the norms before clipping: the
    configured cohort m_t divides, whoever answered (privacy.private_mean divides by the
    answers)."""
    mean, norms = private_mean(deltas, clip, noise_std, generator)
    answered = len(deltas)
    if answered == cohort:
        return mean, norms
    return {name: value * (answered / cohort) for name, value in mean.items()}, norms
