"""raymtl.toolbox.sample_dp: DP-SGD by Opacus on a tiny linear model, checked by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from raymtl.toolbox.sample_dp import make_private
from raymtl.toolbox.settings import SampleLevelSettings

X = torch.tensor(
    [[1.0, 2.0, -1.0], [0.5, -0.3, 0.2], [-2.0, 1.0, 3.0], [0.1, 0.1, 0.1]], dtype=torch.float32
)
Y = torch.tensor([0, 1, 1, 0])


def tiny_model() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def one_step(model, sigma, clip, seed, x=X, y=Y, loss_fn=None):
    """One DP-SGD step with SGD(lr=1) on the whole batch; returns the new state."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    settings = SampleLevelSettings(clip=clip, noise_multiplier=sigma)
    generator = torch.Generator().manual_seed(seed)
    private, dp_optimizer, cleanup = make_private(model, optimizer, settings, len(y), generator)
    dp_optimizer.zero_grad(set_to_none=True)
    out = private(x)
    loss = F.cross_entropy(out, y) if loss_fn is None else loss_fn(out, y)
    loss.backward()
    dp_optimizer.step()
    cleanup()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_no_noise_is_the_mean_of_clipped_per_sample_gradients():
    clip = 0.5
    model = tiny_model()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # By hand: each sample's gradient of its own loss, clipped to C over (weight, bias).
    reference = tiny_model()
    clipped = []
    norms = []
    for i in range(len(Y)):
        reference.zero_grad()
        F.cross_entropy(reference(X[i : i + 1]), Y[i : i + 1]).backward()
        grads = [reference.weight.grad.clone(), reference.bias.grad.clone()]
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        norms.append(norm.item())
        clipped.append([g * min(1.0, clip / norm.item()) for g in grads])
    assert min(norms) < clip < max(norms)  # some samples are clipped, some not
    mean_weight = sum(c[0] for c in clipped) / len(Y)
    mean_bias = sum(c[1] for c in clipped) / len(Y)

    after = one_step(model, sigma=0.0, clip=clip, seed=0)
    torch.testing.assert_close(before["weight"] - after["weight"], mean_weight)
    torch.testing.assert_close(before["bias"] - after["bias"], mean_bias)


def test_noise_follows_the_seed():
    first = one_step(tiny_model(), sigma=1.0, clip=0.5, seed=3)
    again = one_step(tiny_model(), sigma=1.0, clip=0.5, seed=3)
    other = one_step(tiny_model(), sigma=1.0, clip=0.5, seed=4)
    for name in first:
        assert torch.equal(first[name], again[name])
    assert not torch.equal(first["weight"], other["weight"])
    quiet = one_step(tiny_model(), sigma=0.0, clip=0.5, seed=3)
    assert not torch.equal(first["weight"], quiet["weight"])


def test_noise_std_is_sigma_clip_over_batch():
    # Zero per-sample gradients: the step is −noise/B, noise ~ N(0, (σC)²) per entry.
    sigma, clip, batch = 1.5, 2.0, 8
    torch.manual_seed(1)
    model = nn.Linear(200, 100)
    before = model.weight.detach().clone()
    x = torch.randn(batch, 200)
    y = torch.zeros(batch, dtype=torch.long)
    after = one_step(model, sigma, clip, seed=7, x=x, y=y, loss_fn=lambda out, _: 0 * out.sum())
    step = (before - after["weight"]).flatten()
    assert step.numel() == 20_000
    assert step.std().item() == pytest.approx(sigma * clip / batch, rel=0.03)
    assert abs(step.mean().item()) < 5 * sigma * clip / batch / 20_000**0.5


def test_cleanup_gives_back_a_plain_model():
    model = tiny_model()
    one_step(model, sigma=1.0, clip=0.5, seed=0)
    for p in model.parameters():
        for attr in ("grad_sample", "summed_grad", "_forward_counter"):
            assert not hasattr(p, attr), attr
    for module in model.modules():
        assert not module._forward_hooks
        assert not module._backward_hooks
        assert not hasattr(module, "autograd_grad_sample_hooks")
    # A normal backward works and leaves no per-sample gradients.
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(X), Y).backward()
    assert model.weight.grad is not None
    assert not hasattr(model.weight, "grad_sample")
    # Another client can wrap the same model again.
    one_step(model, sigma=1.0, clip=0.5, seed=1)
    assert not hasattr(model.weight, "grad_sample")


def test_cleanup_twice_is_harmless():
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = SampleLevelSettings(clip=1.0, noise_multiplier=0.5)
    _, _, cleanup = make_private(model, optimizer, settings, 4, torch.Generator())
    cleanup()
    cleanup()
    assert not hasattr(model.weight, "grad_sample")


def test_batch_norm_is_refused():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = SampleLevelSettings(clip=1.0, noise_multiplier=0.5)
    with pytest.raises(NotImplementedError):
        make_private(model, optimizer, settings, 4, torch.Generator())


def test_frozen_parameters_stay_put():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    after = one_step(model, sigma=1.0, clip=0.5, seed=0)
    assert torch.equal(before["0.weight"], after["0.weight"])
    assert not torch.equal(before["2.weight"], after["2.weight"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cpu_generator_draws_the_same_noise_for_a_model_on_the_gpu():
    on_cpu = one_step(tiny_model(), sigma=1.0, clip=0.5, seed=5)
    on_gpu = one_step(tiny_model().cuda(), 1.0, 0.5, 5, x=X.cuda(), y=Y.cuda())
    for name in on_cpu:
        torch.testing.assert_close(on_gpu[name].cpu(), on_cpu[name])
