"""Sample-level DP-SGD inside local training (Abadi et al. 2016, "Deep Learning with
Differential Privacy"), docs/ALGORITHMS.md §9.3 last item, by Opacus.

Each step: per-sample gradients g_i (Opacus's GradSampleModule hooks), each clipped to
C_s over all trainable parameters, g̃_i = g_i · min(1, C_s/‖g_i‖₂); their sum plus
N(0, σ_s²C_s²·I); divided by the expected batch size B (mean loss reduction):

    g = (Σ_{i∈batch} g̃_i + N(0, σ_s²C_s²·I)) / B,

then the wrapped optimiser's own step. The noise's std on the mean gradient is σ_s·C_s/B.
ε per client: raymtl.toolbox.accounting.sample_level_epsilon(σ_s, B/n, steps, δ).

The noise comes from the caller's seeded generator (raymtl's derive_seed), drawn on the
generator's device in the parameters' order, then moved to each parameter's device: with a
CPU generator a client draws the same noise whatever device it trains on. Opacus's
`secure_mode` is off (a simulation: whoever knows the seed can remove the noise).

Opacus refuses trainable layers with buffers (BatchNorm): their statistics are not private.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn

from raymtl.toolbox.settings import SampleLevelSettings

__all__ = ["make_private"]

# What Opacus leaves on a parameter: GradSampleModule's own (removed by its cleanup) and the
# optimiser's running sum.
_PARAM_ATTRS = ("grad_sample", "_forward_counter", "_current_grad_sample", "_norm_sample")
_OPTIMIZER_ATTRS = ("summed_grad",)


class _SeededDPOptimizer(DPOptimizer):
    """DPOptimizer whose noise is drawn on the generator's device (not the parameter's), so a
    CPU generator serves a model on any device; on a common device the draws are Opacus's."""

    def add_noise(self) -> None:
        device = self.generator.device if self.generator is not None else None
        for p in self.params:
            summed = p.summed_grad
            if getattr(summed, "_processed", False):
                raise ValueError(
                    "sample-level DP: gradients were not cleared since the last step "
                    "(call optimizer.zero_grad() every step)"
                )
            std = self.noise_multiplier * self.max_grad_norm
            if std == 0:
                noise = torch.zeros_like(summed)
            else:
                noise = torch.normal(
                    mean=0.0,
                    std=std,
                    size=summed.shape,
                    generator=self.generator,
                    device=device if device is not None else summed.device,
                    dtype=summed.dtype,
                ).to(summed.device)
            p.grad = (summed + noise).view_as(p)
            summed._processed = True


def make_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    settings: SampleLevelSettings,
    batch_size: int,
    generator: torch.Generator,
) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]:
    """(wrapped model, wrapped optimiser, cleanup) for DP-SGD on `model`.

    The wrapped model is an opacus GradSampleModule around `model` itself (same
    parameters); the optimiser a DPOptimizer around `optimizer` with noise multiplier σ_s,
    max_grad_norm C_s, expected_batch_size `batch_size` (mean loss reduction) and the
    seeded `generator`. Train with them as usual, calling optimizer.zero_grad() every step.
    `cleanup()` removes Opacus's hooks and attributes from `model`'s parameters, so the
    plain model (and `optimizer`) can serve other clients; calling it twice is harmless.
    """
    if batch_size < 1:
        raise ValueError(f"sample-level DP: the batch size must be ≥ 1 (got {batch_size})")
    wrapped = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=True)
    private_optimizer = _SeededDPOptimizer(
        optimizer,
        noise_multiplier=settings.noise_multiplier,
        max_grad_norm=settings.clip,
        expected_batch_size=batch_size,
        loss_reduction="mean",
        generator=generator,
    )
    closed = False

    def cleanup() -> None:
        nonlocal closed
        if closed:
            return
        closed = True
        wrapped._close()
        for p in model.parameters():
            for attr in _PARAM_ATTRS + _OPTIMIZER_ATTRS:
                if hasattr(p, attr):
                    delattr(p, attr)

    return wrapped, private_optimizer, cleanup
