"""Attacks for robustness studies (docs/ALGORITHMS.md §9.5).

A fraction a of the N clients, drawn once per seed, is malicious for the whole run: the
⌊a·N⌋ clients (from the decimal the user wrote for a: 0.07 of 100 is 7) drawn without
replacement by numpy's default_rng([seed, ATTACK_STREAM]), a stream of its own so that no
other draw of the run moves. The set is recorded with the run. What they do, with the
strength s (AttackSettings.strength):

* sign_flip: send Δ_mal = −s·Δ_k (s = 1 by default);
* scale: send Δ_mal = s·Δ_k (s = 10 by default);
* gaussian: send Δ_mal ~ N(0, s²·I) (s = 1 by default), whatever Δ_k was; the normals are
  drawn on the CPU from the caller's torch.Generator (float32, one tensor after another in
  name order), then moved to each tensor's device and dtype, so a run is the same anywhere;
* label_flip: train honestly on the labels y ↦ C − 1 − y (C classes); the update it sends
  is left as it is: the attack acts on the data.

Only floating tensors of Δ are attacked; any other (integer buffers) passes unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]

ATTACK_STREAM = 0x61747461636B  # "attack" in ASCII: the malicious set's own random stream


def malicious_clients(num_clients: int, fraction: float, seed: int) -> tuple[int, ...]:
    """The ⌊a·N⌋ malicious clients of a run with this seed, sorted."""
    if num_clients < 0:
        raise ValueError(f"num_clients must be at least 0, not {num_clients}")
    exact = Fraction(repr(float(fraction)))
    if not 0 <= exact < 1:
        raise ValueError(f"the malicious fraction must be in [0, 1), not {fraction}")
    count = int(exact * num_clients)  # ⌊·⌋: exact is ≥ 0
    if count == 0:
        return ()
    rng = np.random.default_rng([seed, ATTACK_STREAM])
    chosen = rng.choice(num_clients, size=count, replace=False)
    return tuple(sorted(int(k) for k in chosen))


def _floating(delta: Tensors, attack: Callable[[torch.Tensor], torch.Tensor]) -> Tensors:
    return {name: attack(v) if torch.is_floating_point(v) else v for name, v in delta.items()}


def _sign_flip(delta: Tensors, scale: float, generator: torch.Generator) -> Tensors:
    return _floating(delta, lambda v: v * -float(scale))


def _scale(delta: Tensors, scale: float, generator: torch.Generator) -> Tensors:
    return _floating(delta, lambda v: v * float(scale))


def _gaussian(delta: Tensors, scale: float, generator: torch.Generator) -> Tensors:
    def noise(v: torch.Tensor) -> torch.Tensor:
        draw = torch.randn(tuple(v.shape), generator=generator, dtype=torch.float32)
        return (draw * float(scale)).to(device=v.device, dtype=v.dtype)

    return _floating(delta, noise)


def _honest(delta: Tensors, scale: float, generator: torch.Generator) -> Tensors:
    return dict(delta)


@dataclass(frozen=True)
class _Attack:
    update: Callable[[Tensors, float, torch.Generator], Tensors]
    on_data: bool  # it changes the client's training data (labels)
    on_update: bool  # it changes the update the client sends


ATTACKS: dict[str, _Attack] = {
    "sign_flip": _Attack(_sign_flip, on_data=False, on_update=True),
    "scale": _Attack(_scale, on_data=False, on_update=True),
    "gaussian": _Attack(_gaussian, on_data=False, on_update=True),
    "label_flip": _Attack(_honest, on_data=True, on_update=False),
}


def _attack(kind: str) -> _Attack:
    try:
        return ATTACKS[kind]
    except KeyError:
        raise ValueError(f"unknown attack {kind!r}; known: {', '.join(ATTACKS)}") from None


def attack_update(kind: str, delta: Tensors, scale: float, generator: torch.Generator) -> Tensors:
    """The update a malicious client sends instead of `delta` (a new dict, names in order)."""
    return _attack(kind).update(delta, scale, generator)


def flip_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """label_flip's labels: y ↦ C − 1 − y (same dtype and device)."""
    if torch.is_floating_point(labels) or labels.dtype == torch.bool:
        raise TypeError(f"label_flip needs integer class labels, not {labels.dtype}")
    return (num_classes - 1) - labels


def attacks_data(kind: str) -> bool:
    """Whether the attack changes the client's training data (label_flip)."""
    return _attack(kind).on_data


def attacks_update(kind: str) -> bool:
    """Whether the attack changes the update the client sends."""
    return _attack(kind).on_update
