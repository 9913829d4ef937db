"""The maths algorithms share to combine what they receive: a fixed order for an inbox, the
finiteness guard, and the weighted average (Flower's `aggregate` module, as pure torch).

    by_sender(inbox)            messages sorted by (sender, kind): float sums that do not
                                depend on arrival order (inline and Ray give equal results)
    weighted_average(updates)   Σ_k w_k·x_k / Σ_k w_k over the finite updates (None: none)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from raymtl.algorithms.base import Message

log = logging.getLogger(__name__)


def by_sender(inbox: list[Message]) -> list[Message]:
    """Messages in a fixed order (by sender), so sums are order independent."""
    return sorted(inbox, key=lambda message: (message.src, message.kind))


def is_finite(tensors: dict[str, torch.Tensor]) -> bool:
    """True when no tensor holds NaN or inf (non-finite updates are never aggregated)."""
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


def weighted_average(
    updates: Iterable[tuple[dict[str, torch.Tensor], float]],
) -> dict[str, torch.Tensor] | None:
    """Σ_k w_k·x_k / Σ_k w_k over finite updates; None when none is usable.

    The caller fixes the order of `updates` (sorted by sender) so the float sum
    is the same whatever order the messages arrived in.
    """
    finite = []
    for tensors, weight in updates:
        if is_finite(tensors):
            finite.append((tensors, weight))
        else:
            log.warning("rejected a non-finite update (not aggregated)")
    total = sum(weight for _, weight in finite)
    if not finite or total <= 0:
        return None
    return weighted_sum(finite, total)


def weighted_sum(
    updates: list[tuple[dict[str, torch.Tensor], float]], total: float
) -> dict[str, torch.Tensor]:
    """Σ_k (w_k/total)·x_k for every name of the first update, summed in the order given
    (the tensor part of `weighted_average`, where the updates are)."""
    return {
        name: sum(tensors[name] * (weight / total) for tensors, weight in updates)
        for name in updates[0][0]
    }
