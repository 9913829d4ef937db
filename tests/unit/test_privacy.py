"""raymtl.toolbox.privacy (docs/ALGORITHMS.md §9.3) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from raymtl.toolbox.privacy import (
    adaptive_clip,
    clip_update,
    default_count_sigma,
    default_delta,
    gaussian_noise_like,
    private_mean,
    sigma_delta,
    sigma_delta_warning,
    update_norm,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_update_norm_over_all_floating_tensors():
    delta = {
        "a": torch.tensor([3.0, 0.0]),
        "b": torch.tensor([[4.0]], dtype=torch.float64),
        "steps": torch.tensor(100),  # an integer counter: not part of the vector
    }
    assert update_norm(delta) == 5.0
    assert update_norm({}) == 0.0
    assert update_norm({"n": torch.tensor([7])}) == 0.0


def test_update_norm_accumulates_in_float64():
    # 1e20² overflows float32; the float64 sum does not.
    assert update_norm({"a": torch.tensor([1e20, 1e20])}) == pytest.approx(math.sqrt(2) * 1e20)


def test_clip_scales_down_to_the_bound():
    clipped, norm = clip_update({"a": torch.tensor([3.0, 4.0])}, 1.0)
    assert norm == 5.0
    torch.testing.assert_close(clipped["a"], torch.tensor([0.6, 0.8]))


def test_clip_spans_tensors():
    # ‖([3], [4])‖ = 5, C = 2.5: every entry halves.
    clipped, norm = clip_update({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])}, 2.5)
    assert norm == 5.0
    torch.testing.assert_close(clipped["a"], torch.tensor([1.5]))
    torch.testing.assert_close(clipped["b"], torch.tensor([2.0]))


def test_clip_leaves_small_and_zero_updates_alone():
    small = {"a": torch.tensor([0.3, 0.4])}
    clipped, norm = clip_update(small, 1.0)
    assert norm == pytest.approx(0.5)
    assert torch.equal(clipped["a"], small["a"])
    assert clipped["a"] is not small["a"]  # a copy
    zero, norm = clip_update({"a": torch.zeros(3)}, 1.0)
    assert norm == 0.0
    assert torch.equal(zero["a"], torch.zeros(3))


def test_clip_keeps_dtype_and_passes_integers_through():
    delta = {"h": torch.tensor([6.0, 8.0], dtype=torch.float16), "n": torch.tensor([5])}
    clipped, norm = clip_update(delta, 5.0)
    assert norm == 10.0
    assert clipped["h"].dtype == torch.float16
    torch.testing.assert_close(clipped["h"], torch.tensor([3.0, 4.0], dtype=torch.float16))
    assert torch.equal(clipped["n"], torch.tensor([5]))


def test_clip_refuses_a_non_positive_bound():
    with pytest.raises(ValueError, match="privacy.clip"):
        clip_update({"a": torch.ones(2)}, 0.0)


def test_noise_std_and_mean():
    std = 0.7
    noise = gaussian_noise_like({"a": torch.zeros(200_000)}, std, gen(1))["a"]
    assert noise.shape == (200_000,)
    assert noise.std().item() == pytest.approx(std, rel=0.01)
    assert abs(noise.mean().item()) < 5 * std / math.sqrt(200_000)


def test_noise_is_seeded_and_in_name_order():
    shapes = {"b": torch.zeros(3), "a": torch.zeros(2, 2)}
    first = gaussian_noise_like(shapes, 1.0, gen(5))
    again = gaussian_noise_like(dict(reversed(list(shapes.items()))), 1.0, gen(5))
    assert list(first) == ["b", "a"]  # the caller's key order
    for name in shapes:
        assert torch.equal(first[name], again[name])  # drawn in sorted-name order
    # "a" is drawn first: its 4 entries are the generator's first 4 normals.
    by_hand = torch.randn(7, generator=gen(5))
    assert torch.equal(first["a"].flatten(), by_hand[:4])
    assert torch.equal(first["b"], by_hand[4:])
    other = gaussian_noise_like(shapes, 1.0, gen(6))
    assert not torch.equal(first["a"], other["a"])


def test_noise_dtype_zero_std_and_integers():
    tensors = {"h": torch.zeros(4, dtype=torch.bfloat16), "n": torch.zeros(2, dtype=torch.long)}
    noise = gaussian_noise_like(tensors, 1.0, gen())
    assert noise["h"].dtype == torch.bfloat16
    assert torch.equal(noise["n"], torch.zeros(2, dtype=torch.long))
    g = gen(3)
    state = g.get_state()
    quiet = gaussian_noise_like({"a": torch.ones(3)}, 0.0, g)
    assert torch.equal(quiet["a"], torch.zeros(3))
    assert torch.equal(g.get_state(), state)  # nothing drawn


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_noise_is_the_same_on_the_gpu():
    on_cpu = gaussian_noise_like({"a": torch.zeros(1000)}, 1.0, gen(2))["a"]
    on_gpu = gaussian_noise_like({"a": torch.zeros(1000, device="cuda")}, 1.0, gen(2))["a"]
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), on_cpu)


def test_private_mean_without_noise_by_hand():
    deltas = [
        {"a": torch.tensor([3.0, 4.0])},  # norm 5 → [0.6, 0.8]
        {"a": torch.tensor([0.0, 0.5])},  # norm 0.5, kept
        {"a": torch.tensor([0.0, 0.0])},  # norm 0
    ]
    mean, norms = private_mean(deltas, 1.0, 0.0, gen())
    assert norms == pytest.approx([5.0, 0.5, 0.0])
    torch.testing.assert_close(mean["a"], torch.tensor([0.6 / 3, 1.3 / 3]))
    assert mean["a"].dtype == torch.float32


def test_private_mean_adds_the_seeded_noise_once():
    deltas = [{"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0])}] * 2
    mean, _ = private_mean(deltas, 1.0, 0.5, gen(9))
    noise = gaussian_noise_like(deltas[0], 0.5, gen(9))
    clipped = torch.tensor([0.6, 0.8]) / math.sqrt(1.0 + 25.0) * 5.0  # ‖(3, 4, 1)‖ = √26
    torch.testing.assert_close(mean["a"], (2 * clipped + noise["a"]) / 2)
    torch.testing.assert_close(mean["b"], (2 * torch.tensor([1 / math.sqrt(26)]) + noise["b"]) / 2)


def test_private_mean_noise_std_of_the_mean():
    # std of (Σ clip + N(0, s²)) / m is s/m.
    deltas = [{"a": torch.zeros(100_000)}] * 4
    mean, _ = private_mean(deltas, 1.0, 2.0, gen(4))
    assert mean["a"].std().item() == pytest.approx(0.5, rel=0.02)


def test_private_mean_refusals():
    with pytest.raises(ValueError, match="at least one"):
        private_mean([], 1.0, 0.0, gen())
    with pytest.raises(ValueError, match="other tensors"):
        private_mean([{"a": torch.ones(1)}, {"b": torch.ones(1)}], 1.0, 0.0, gen())
    with pytest.raises(ValueError, match="non-floating"):
        private_mean([{"a": torch.ones(1), "n": torch.tensor([1])}], 1.0, 0.0, gen())


def test_noise_needs_a_cpu_generator():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU to make a CUDA generator")
    with pytest.raises(ValueError, match="CPU"):
        gaussian_noise_like({"a": torch.zeros(1)}, 1.0, torch.Generator(device="cuda"))


def test_sigma_delta_formula():
    # σ = 1, σ_b = 1: (1 − 1/4)^−1/2 = 2/√3.
    assert sigma_delta(1.0, 1.0) == pytest.approx(2 / math.sqrt(3))
    # σ = 0.6, σ_b = 0.5: (1/0.36 − 1)^−1/2.
    assert sigma_delta(0.6, 0.5) == pytest.approx((1 / 0.36 - 1) ** -0.5)
    assert sigma_delta(0.0, 0.0) == 0.0
    assert sigma_delta(0.0, 3.0) == 0.0


def test_sigma_delta_refusal():
    with pytest.raises(ValueError) as info:
        sigma_delta(1.0, 0.5)  # 2σ_b = σ
    assert str(info.value) == (
        "privacy.count_noise: adaptive clipping needs 2σ_b > σ (σ = 1, σ_b = 0.5)"
    )
    with pytest.raises(ValueError, match="2σ_b > σ"):
        sigma_delta(1.0, 0.0)


def test_sigma_delta_warning():
    assert sigma_delta_warning(1.0, 1.0) is None  # σ_Δ/σ = 1.155
    assert sigma_delta_warning(0.0, 1.0) is None
    # σ_Δ/σ = 2 exactly when (2σ_b)^−2 = 3/4 σ^−2, i.e. σ_b = σ/√3.
    assert sigma_delta_warning(1.0, 0.55) is not None  # σ_Δ/σ ≈ 2.4
    assert sigma_delta_warning(1.0, 0.6) is None  # σ_Δ/σ ≈ 1.81
    assert "σ_Δ" in sigma_delta_warning(1.0, 0.55)
    with pytest.raises(ValueError):
        sigma_delta_warning(1.0, 0.5)


def test_adaptive_clip_step_by_hand():
    # C = 1, 3 of 4 below, γ = 0.5, η = 0.2, σ_b = 0: b̄ = 0.75, C·exp(−0.2·0.25).
    new = adaptive_clip(1.0, [True, True, True, False], 0.0, 0.5, 0.2, gen())
    assert new == pytest.approx(math.exp(-0.2 * 0.25))
    # None below: b̄ = 0, C grows: 2·exp(0.2·0.5).
    assert adaptive_clip(2.0, [False] * 3, 0.0, 0.5, 0.2, gen()) == pytest.approx(2 * math.exp(0.1))


def test_adaptive_clip_noise_is_one_seeded_draw():
    noise = torch.randn((), generator=gen(11), dtype=torch.float64).item() * 0.4
    expected = 1.5 * math.exp(-0.2 * ((2 + noise) / 4 - 0.5))
    new = adaptive_clip(1.5, [True, False, True, False], 0.4, 0.5, 0.2, gen(11))
    assert new == pytest.approx(expected, rel=1e-12)


def test_defaults():
    assert default_delta(100) == 1e-5  # 100^−1.1 ≈ 6.3e-3
    assert default_delta(10**6) == pytest.approx(1e6**-1.1)  # ≈ 2.5e-7 < 1e-5
    assert default_delta(10**6) < 1e-6
    assert default_count_sigma(40) == 2.0
    assert default_count_sigma(10) == 0.5
    with pytest.raises(ValueError):
        default_delta(0)
