"""Client-level differential privacy of the update (DP-FedAvg), docs/ALGORITHMS.md §9.3.

McMahan, Ramage, Talwar, Zhang 2018, "Learning Differentially Private Recurrent Language
Models" (clipping, the noisy sum, the sampled Gaussian mechanism); Andrew, Thakkar, McMahan,
Ramaswamy 2021, "Differentially Private Learning with Adaptive Clipping" (the clip norm
tracks a quantile of the update norms, privately).

The maths, with Δ_k a client's update (all its floating tensors read as one vector):

    ‖Δ‖₂      = sqrt(Σ over every entry of every floating tensor of Δ²)   (float64 sum)
    clip:       Δ̃_k = Δ_k · min(1, C / ‖Δ_k‖₂)                    (‖Δ_k‖₂ = 0: Δ̃_k = Δ_k)
    noisy mean: Δ_t = (Σ_{k∈S_t} Δ̃_k + N(0, s²·I)) / m_t,    s = σ·C (the caller's product)
    adaptive:   b_k = 1[‖Δ_k‖₂ ≤ C],   b̄ = (Σ_k b_k + N(0, σ_b²)) / m_t,
                C ← C · exp(−η_C · (b̄ − γ))
    σ_Δ = (σ^−2 − (2σ_b)^−2)^−1/2  (needs 2σ_b > σ): the update noise multiplier that, with
                the count's noise σ_b, spends what σ alone would (Andrew et al. 2021)
    defaults:   δ = min(1e-5, N^−1.1),  σ_b = m/20.

The weights are uniform (1/m_t): weighting by samples would raise the sum's sensitivity.

Every draw comes from the caller's seeded CPU `torch.Generator` and is made on the CPU in the
tensors' sorted-name order, then moved to each tensor's device and dtype, so a run draws the
same noise on any device and its resume is bitwise equal. That is a simulation's convenience:
whoever knows the seed can remove the noise; a deployment draws from a secure generator.

Non-floating tensors (integer counters) are outside the privatised vector: `update_norm`
skips them, `clip_update` passes them through, `gaussian_noise_like` gives them zeros and
`private_mean` refuses them (their sum would have no sensitivity bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Tensors = dict[str, torch.Tensor]

__all__ = [
    "Tensors",
    "adaptive_clip",
    "clip_update",
    "default_count_sigma",
    "default_delta",
    "gaussian_noise_like",
    "private_mean",
    "sigma_delta",
    "sigma_delta_warning",
    "update_norm",
]


def update_norm(delta: Tensors) -> float:
    """‖Δ‖₂ over all floating tensors of `delta`, accumulated in float64 on the tensors'
    device (one transfer back). No floating tensor: 0.0."""
    squares = [
        value.detach().to(torch.float64).square().sum()
        for value in delta.values()
        if value.is_floating_point()
    ]
    if not squares:
        return 0.0
    device = squares[0].device
    return float(torch.stack([s.to(device) for s in squares]).sum().sqrt())


def _check_clip(clip: float) -> None:
    if not (clip > 0 and math.isfinite(clip)):
        raise ValueError(f"privacy.clip: must be a positive finite number (got {clip})")


def clip_update(delta: Tensors, clip: float) -> tuple[Tensors, float]:
    """(Δ·min(1, C/‖Δ‖₂), ‖Δ‖₂): the clipped copy (new tensors, same dtypes and devices)
    and the norm before clipping. A zero update stays zero; non-floating tensors are copied
    unchanged."""
    _check_clip(clip)
    norm = update_norm(delta)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    clipped = {
        name: (value.detach() * scale if scale < 1.0 else value.detach().clone())
        if value.is_floating_point()
        else value.detach().clone()
        for name, value in delta.items()
    }
    return clipped, norm


def _check_generator(generator: torch.Generator) -> None:
    if generator.device.type != "cpu":
        raise ValueError(
            f"privacy: noise is drawn on the CPU; got a generator on {generator.device}"
        )


def gaussian_noise_like(tensors: Tensors, std: float, generator: torch.Generator) -> Tensors:
    """N(0, std²) for every entry of every floating tensor (zeros for the others).

    Drawn on the CPU from `generator` in sorted-name order (float64 for float64 tensors,
    float32 otherwise), then moved to each tensor's device and dtype: the same numbers
    whatever the device. std = 0 gives zeros and leaves the generator untouched. The result
    keeps `tensors`' key order.
    """
    if not (std >= 0 and math.isfinite(std)):
        raise ValueError(f"privacy: the noise std must be finite and ≥ 0 (got {std})")
    _check_generator(generator)
    noise: Tensors = {}
    for name in sorted(tensors):
        value = tensors[name]
        if not value.is_floating_point() or std == 0:
            noise[name] = torch.zeros_like(value)
            continue
        draw_dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
        draw = torch.randn(value.shape, generator=generator, dtype=draw_dtype)
        noise[name] = draw.mul_(std).to(device=value.device, dtype=value.dtype)
    return {name: noise[name] for name in tensors}


def private_mean(
    deltas: Sequence[Tensors], clip: float, noise_std: float, generator: torch.Generator
) -> tuple[Tensors, list[float]]:
    """(Σ_k clip(Δ_k, C) + N(0, noise_std²·I)) / m and the m norms before clipping.

    `noise_std` is the absolute std s = σ·C (the caller's product). Uniform weights. The
    sum is accumulated in float64 on the first update's devices; the result has the first
    update's dtypes, devices and key order. Every update must hold the same names, all
    floating.
    """
    if not deltas:
        raise ValueError("privacy: private_mean needs at least one update")
    _check_clip(clip)
    names = list(deltas[0])
    for k, delta in enumerate(deltas):
        if set(delta) != set(names):
            raise ValueError(
                f"privacy: update {k} holds other tensors than update 0 "
                f"({sorted(set(delta) ^ set(names))})"
            )
        integral = sorted(name for name, value in delta.items() if not value.is_floating_point())
        if integral:
            raise ValueError(
                f"privacy: non-floating tensors in the update have no sensitivity bound: {integral}"
            )
    first = deltas[0]
    total = {name: torch.zeros_like(first[name], dtype=torch.float64) for name in names}
    norms = []
    for delta in deltas:
        clipped, norm = clip_update(delta, clip)
        norms.append(norm)
        for name in names:
            total[name] += clipped[name].to(device=total[name].device, dtype=torch.float64)
    noise = gaussian_noise_like(first, noise_std, generator)
    m = len(deltas)
    mean = {
        name: ((total[name] + noise[name].to(torch.float64)) / m).to(first[name].dtype)
        for name in names
    }
    return mean, norms


def sigma_delta(sigma: float, count_sigma: float) -> float:
    """σ_Δ = (σ^−2 − (2σ_b)^−2)^−1/2, the update's noise multiplier with adaptive clipping.

    σ = 0 gives 0 (no noise, nothing spent). Raises ValueError unless 2σ_b > σ.
    """
    if sigma < 0 or count_sigma < 0:
        raise ValueError(
            f"privacy: noise multipliers must be ≥ 0 (σ = {sigma:g}, σ_b = {count_sigma:g})"
        )
    if sigma == 0:
        return 0.0
    if not 2 * count_sigma > sigma:
        raise ValueError(
            f"privacy.count_noise: adaptive clipping needs 2σ_b > σ "
            f"(σ = {sigma:g}, σ_b = {count_sigma:g})"
        )
    return (sigma**-2 - (2 * count_sigma) ** -2) ** -0.5


def sigma_delta_warning(sigma: float, count_sigma: float) -> str | None:
    """A one-line warning when σ_Δ/σ ≥ 2 (the count's noise takes most of the budget, as the
    authors' TFF code warns), else None. Raises as `sigma_delta` does when 2σ_b ≤ σ."""
    value = sigma_delta(sigma, count_sigma)
    if sigma == 0 or value / sigma < 2:
        return None
    return (
        f"privacy.count_noise: σ_b = {count_sigma:g} is small for σ = {sigma:g}: the "
        f"update's noise multiplier becomes σ_Δ = {value:.4g} ({value / sigma:.3g}·σ); "
        f"raise count_noise or lower noise_multiplier"
    )


def adaptive_clip(
    clip: float,
    below: Sequence[bool],
    count_sigma: float,
    target_quantile: float,
    clip_lr: float,
    generator: torch.Generator,
) -> float:
    """The next clip norm C·exp(−η_C·(b̄ − γ)), b̄ = (Σ_k b_k + N(0, σ_b²)) / m.

    `below` holds b_k = ‖Δ_k‖₂ ≤ C for the m sampled clients. One float64 draw from the CPU
    `generator` when σ_b > 0 (none when σ_b = 0).
    """
    _check_clip(clip)
    if not below:
        raise ValueError("privacy: adaptive clipping needs at least one client's bit")
    if count_sigma < 0:
        raise ValueError(f"privacy.count_noise: must be ≥ 0 (got {count_sigma:g})")
    _check_generator(generator)
    noise = 0.0
    if count_sigma > 0:
        noise = float(torch.randn((), generator=generator, dtype=torch.float64)) * count_sigma
    fraction = (sum(bool(b) for b in below) + noise) / len(below)
    return clip * math.exp(-clip_lr * (fraction - target_quantile))


def default_delta(num_clients: int) -> float:
    """δ = min(1e-5, N^−1.1): below 1/N, as a client-level guarantee needs."""
    if num_clients < 1:
        raise ValueError(f"privacy: the population must be ≥ 1 client (got {num_clients})")
    return min(1e-5, float(num_clients) ** -1.1)


def default_count_sigma(cohort: int) -> float:
    """σ_b = m/20, Andrew et al.'s default for the clipped count's noise."""
    if cohort < 1:
        raise ValueError(f"privacy: the cohort must be ≥ 1 client (got {cohort})")
    return cohort / 20
